"""Bad input never crashes the daemon and always gets a clear error."""

import unittest

import grpc

from harness import DaemonTestCase
from latentd.v1 import jobs_pb2, train_pb2


class BadInput(DaemonTestCase):
    def setUp(self):
        super().setUp()
        self.daemon = self.start_daemon(devices="cpu:2")
        self.client = self.daemon.client()

    def expect(self, code, fragment, call):
        with self.assertRaises(grpc.RpcError) as ctx:
            result = call()
            if hasattr(result, "__iter__") and not hasattr(result, "ListFields"):
                list(result)
        self.assertEqual(ctx.exception.code(), code, ctx.exception.details())
        self.assertIn(fragment, ctx.exception.details())

    def test_table(self):
        c = self.client
        stub = c.jobs
        huge = "x" * (17 << 20)
        cases = [
            ("no type", grpc.StatusCode.INVALID_ARGUMENT, "spec.type",
             lambda: stub.SubmitJob(jobs_pb2.SubmitJobRequest(spec=jobs_pb2.JobSpec()))),
            ("too many devices", grpc.StatusCode.INVALID_ARGUMENT, "spec.num_devices",
             lambda: c.submit("PROBE", num_devices=3)),
            ("negative devices", grpc.StatusCode.INVALID_ARGUMENT, "spec.num_devices",
             lambda: c.submit("PROBE", num_devices=-1)),
            ("bad probe size", grpc.StatusCode.INVALID_ARGUMENT, "probe.matmul_size",
             lambda: c.submit("PROBE", {"matmulSize": -5})),
            ("spec of another type", grpc.StatusCode.INVALID_ARGUMENT, "spec",
             lambda: stub.SubmitJob(jobs_pb2.SubmitJobRequest(spec=jobs_pb2.JobSpec(
                 type=jobs_pb2.PROBE, train=train_pb2.TrainSpec())))),
            ("long request id", grpc.StatusCode.INVALID_ARGUMENT, "request_id",
             lambda: c.submit("PROBE", request_id="r" * 200)),
            ("unknown job", grpc.StatusCode.NOT_FOUND, "job 424242",
             lambda: c.get(424242)),
            ("watch unknown job", grpc.StatusCode.NOT_FOUND, "job 424242",
             lambda: c.watch(424242)),
            ("cancel unknown job", grpc.StatusCode.NOT_FOUND, "job 424242",
             lambda: c.cancel(424242)),
            ("bad page token", grpc.StatusCode.INVALID_ARGUMENT, "page_token",
             lambda: stub.ListJobs(jobs_pb2.ListJobsRequest(page_token="nope"))),
            ("oversized message", grpc.StatusCode.RESOURCE_EXHAUSTED, "",
             lambda: c.submit("PROBE", label=huge)),
        ]
        for name, code, fragment, call in cases:
            with self.subTest(name):
                self.expect(code, fragment, call)

        done = c.wait(c.submit("PROBE", {"matmulSize": 64, "iterations": 1}).id)
        self.expect(grpc.StatusCode.FAILED_PRECONDITION, "already finished",
                    lambda: c.cancel(done.id))

    def test_malformed_bytes_do_not_crash_the_daemon(self):
        raw = self.client.channel.unary_unary("/latentd.v1.Jobs/GetJob",
                                              request_serializer=None,
                                              response_deserializer=None)
        with self.assertRaises(grpc.RpcError) as ctx:
            raw(b"\xff\xff\xff\xff\x0f", timeout=10)
        self.assertNotEqual(ctx.exception.code(), grpc.StatusCode.OK)
        unknown = self.client.channel.unary_unary("/latentd.v1.Jobs/NoSuchMethod",
                                                  request_serializer=None,
                                                  response_deserializer=None)
        with self.assertRaises(grpc.RpcError) as ctx:
            unknown(b"", timeout=10)
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
        # Still alive and serving.
        self.assertEqual(self.daemon.health(), 1)
        job = self.client.submit("PROBE", {"matmulSize": 64, "iterations": 1})
        self.assertEqual(self.client.wait(job.id).state, jobs_pb2.SUCCEEDED)


if __name__ == "__main__":
    unittest.main()
