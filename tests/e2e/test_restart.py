"""kill -9 and SIGTERM: no acknowledged submission is lost and interrupted jobs run again."""

import time
import unittest

from harness import DaemonTestCase
from latentd.v1 import jobs_pb2

LONG_PROBE = {"matmulSize": 384, "iterations": 400}


class Restart(DaemonTestCase):
    def test_kill9_while_running_then_restart_runs_the_job_to_succeeded(self):
        daemon = self.start_daemon(devices="cpu:1")
        client = daemon.client()
        running = client.submit("PROBE", LONG_PROBE, request_id="survivor")
        queued = client.submit("PROBE", {"matmulSize": 64, "iterations": 2})
        self.wait_for_state(client, running.id, [jobs_pb2.RUNNING])
        client.close()
        daemon.kill9()

        daemon.start()
        client = daemon.client()
        final = client.wait(running.id)
        self.assertEqual(final.state, jobs_pb2.SUCCEEDED)
        self.assertEqual(final.attempts, 2)
        events = list(client.watch(running.id))
        states = [(e.state.state, e.state.reason) for e in events if e.HasField("state")]
        self.assertEqual(states[0][0], jobs_pb2.PENDING)
        self.assertIn((jobs_pb2.PENDING, jobs_pb2.INTERRUPTED), states)
        self.assertEqual([s for s, _ in states].count(jobs_pb2.RUNNING), 2)
        self.assertEqual(states[-1][0], jobs_pb2.SUCCEEDED)
        self.assertEqual([e.sequence for e in events], list(range(1, len(events) + 1)))
        # The job queued behind it was acknowledged before the kill, so it exists and runs too.
        self.assertEqual(client.wait(queued.id).state, jobs_pb2.SUCCEEDED)
        # Its request id still maps to it.
        self.assertEqual(client.submit("PROBE", LONG_PROBE, request_id="survivor").id, running.id)

    def test_sigterm_stops_at_a_safe_point_and_the_job_resumes(self):
        daemon = self.start_daemon(devices="cpu:1")
        client = daemon.client()
        job = client.submit("PROBE", LONG_PROBE)
        self.wait_for_state(client, job.id, [jobs_pb2.RUNNING])
        client.close()
        started = time.time()
        self.assertEqual(daemon.terminate(), 0)
        self.assertLess(time.time() - started, 30)
        log = daemon.read_log()
        self.assertIn("stopped", log)

        daemon.start()
        client = daemon.client()
        final = client.wait(job.id)
        self.assertEqual(final.state, jobs_pb2.SUCCEEDED)
        self.assertEqual(final.attempts, 2)
        interrupted = [e.state for e in client.watch(job.id)
                       if e.HasField("state") and e.state.reason == jobs_pb2.INTERRUPTED]
        self.assertEqual(len(interrupted), 1)
        self.assertEqual(interrupted[0].state, jobs_pb2.PENDING)
        self.assertIn("safe point", interrupted[0].message)


if __name__ == "__main__":
    unittest.main()
