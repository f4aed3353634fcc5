"""S1 service benchmark (shared/notes/workloads.md): latentd on loopback, 64 concurrent WatchJob
streams while jobs run, 1000 GetJob calls from 8 clients; p50/p99 latency against the health Check
of the same daemon in the same run (the floor of one loopback RPC from Python), and a check that no
event is lost or reordered on any stream.

    bazel build //server:latentd //client:latentctl //proto:api_py
    PYTHONPATH=bazel-bin/proto/py:client/python:tests/e2e /usr/bin/python3 bench/service_bench.py
"""

import os
import statistics
import tempfile
import threading
import time

from harness import Daemon
from grpc_health.v1 import health_pb2, health_pb2_grpc
from latentd.v1 import jobs_pb2

WATCHERS = 64
CLIENTS = 8
GETS = 1000
JOBS = 8


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main():
    with tempfile.TemporaryDirectory() as tmp:
        daemon = Daemon(os.path.join(tmp, "d"), devices="cpu:2").start()
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
        finally:
            daemon.stop()


if __name__ == "__main__":
    main()
