"""S1 service benchmark (shared/notes/workloads.md): latentd on loopback, 64 concurrent WatchJob
streams while jobs run, 1000 GetJob calls from 8 clients; p50/p99 latency against the health Check
of the same daemon in the same run (the floor of one loopback RPC from Python), and a check that no
event is lost or reordered on any stream. Then the HTTP side: GET /metrics with the manager
holding a thousand finished jobs, against GET /healthz of the same endpoint (the floor of one
loopback HTTP request from Python).

    bazel build //server:latentd //client:latentctl //proto:api_py
    PYTHONPATH=bazel-bin/proto/py:client/python:tests/e2e /usr/bin/python3 bench/service_bench.py
"""

import os
import statistics
import tempfile
import threading
import time
import urllib.request

from harness import Daemon
from grpc_health.v1 import health_pb2, health_pb2_grpc
from latentd.v1 import jobs_pb2

WATCHERS = 64
CLIENTS = 8
GETS = 1000
JOBS = 8
FINISHED_JOBS = 1000
SCRAPES = 200


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def scrape_benchmark(client, port_file):
    """GET /metrics against GET /healthz, one request at a time (the endpoint serves them in
    turn), with FINISHED_JOBS more jobs held."""
    small = [client.submit("PROBE", {"matmulSize": 8, "iterations": 1, "bandwidthBytes": 4096})
             for _ in range(FINISHED_JOBS)]
    client.wait(small[-1].id)
    with open(port_file) as f:
        port = int(f.read())

    def get(path):
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=30) as r:
            return r.read()

    scrape_lat, healthz_lat = [], []
    size = 0
    for _ in range(SCRAPES):  # alternating, so that both see the same machine
        start = time.perf_counter()
        size = len(get("/metrics"))
        scrape_lat.append(time.perf_counter() - start)
        start = time.perf_counter()
        get("/healthz")
        healthz_lat.append(time.perf_counter() - start)
    held = sum(1 for _ in client.list())
    ms = lambda s: s * 1000
    print("GET /metrics  p50 %.2f ms  p99 %.2f ms  (%d jobs held, %d bytes)" % (
        ms(percentile(scrape_lat, 0.5)), ms(percentile(scrape_lat, 0.99)), held, size))
    print("GET /healthz  p50 %.2f ms  p99 %.2f ms  (loopback HTTP floor, same run)" % (
        ms(percentile(healthz_lat, 0.5)), ms(percentile(healthz_lat, 0.99))))
    print("ratio /metrics / /healthz p50 %.2f" % (
        percentile(scrape_lat, 0.5) / percentile(healthz_lat, 0.5)))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        port_file = os.path.join(tmp, "metrics_port")
        daemon = Daemon(os.path.join(tmp, "d"), devices="cpu:2", extra_args=[
            "--metrics_listen=127.0.0.1:0", "--metrics_port_file=" + port_file]).start()
        try:
            client = daemon.client()
            jobs = [client.submit("PROBE", {"matmulSize": 256, "iterations": 40}) for _ in range(JOBS)]
            problems = []
            counts = []

            def watch(job_id):
                seqs = [e.sequence for e in client.watch(job_id)]
                counts.append(len(seqs))
                if seqs != list(range(1, len(seqs) + 1)):
                    problems.append("job %d: sequences %s" % (job_id, seqs[:20]))

            watchers = [threading.Thread(target=watch, args=(jobs[i % JOBS].id,))
                        for i in range(WATCHERS)]
            for w in watchers:
                w.start()

            def timed(call, n, out):
                for _ in range(n):
                    start = time.perf_counter()
                    call()
                    out.append(time.perf_counter() - start)

            health = health_pb2_grpc.HealthStub(client.channel)
            get_lat, health_lat = [], []
            threads = []
            for i in range(CLIENTS):
                job_id = jobs[i % JOBS].id
                threads.append(threading.Thread(target=timed, args=(
                    lambda job_id=job_id: client.get(job_id), GETS // CLIENTS, get_lat)))
                threads.append(threading.Thread(target=timed, args=(
                    lambda: health.Check(health_pb2.HealthCheckRequest()), GETS // CLIENTS,
                    health_lat)))
            start = time.time()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.time() - start
            for w in watchers:
                w.join()
            final = [client.get(j.id).state for j in jobs]
            ms = lambda s: s * 1000
            print("S1: %d WatchJob streams over %d PROBE jobs, %d GetJob + %d health calls from %d "
                  "clients in %.2f s" % (WATCHERS, JOBS, len(get_lat), len(health_lat), CLIENTS,
                                         elapsed))
            print("GetJob  p50 %.2f ms  p99 %.2f ms" % (ms(percentile(get_lat, 0.5)),
                                                       ms(percentile(get_lat, 0.99))))
            print("Health  p50 %.2f ms  p99 %.2f ms  (loopback RPC floor, same run)" % (
                ms(percentile(health_lat, 0.5)), ms(percentile(health_lat, 0.99))))
            print("ratio GetJob/Health p50 %.2f  p99 %.2f" % (
                percentile(get_lat, 0.5) / percentile(health_lat, 0.5),
                percentile(get_lat, 0.99) / percentile(health_lat, 0.99)))
            print("events per stream: min %d, median %d; streams with lost/reordered events: %d" % (
                min(counts), statistics.median(counts), len(problems)))
            print("jobs succeeded: %d/%d" % (final.count(jobs_pb2.SUCCEEDED), JOBS))
            for p in problems[:5]:
                print("PROBLEM", p)
            scrape_benchmark(client, port_file)
        finally:
            daemon.stop()


if __name__ == "__main__":
    main()
