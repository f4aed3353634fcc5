"""A small Python client for latentd over its generated gRPC stubs.

The stubs come from the build: `bazel build //proto:api_py` writes them under bazel-bin/proto/py;
put that directory and this one on PYTHONPATH (scripts/latentd-python does it for you).

    from latentd_client import Client
    c = Client("127.0.0.1:50051")
    job = c.submit("PROBE")
    for event in c.watch(job.id):
        print(event)
    print(c.get(job.id).result)
"""

import grpc
from google.protobuf import json_format

from latentd.v1 import datasets_pb2, datasets_pb2_grpc
from latentd.v1 import devices_pb2, devices_pb2_grpc
from latentd.v1 import jobs_pb2, jobs_pb2_grpc

TERMINAL_STATES = (jobs_pb2.SUCCEEDED, jobs_pb2.FAILED, jobs_pb2.CANCELLED)


class Client:
    def __init__(self, server="127.0.0.1:50051", token=None, token_file=None, timeout=60.0):
        if token_file:
            with open(token_file) as f:
                token = f.readline().strip()
        self.channel = grpc.insecure_channel(server)
        self.jobs = jobs_pb2_grpc.JobsStub(self.channel)
        self.devices = devices_pb2_grpc.DevicesStub(self.channel)
        self.datasets = datasets_pb2_grpc.DatasetsStub(self.channel)
        self.metadata = (("authorization", "Bearer " + token),) if token else ()
        self.timeout = timeout

    def close(self):
        self.channel.close()

    def submit(self, job_type, spec=None, request_id="", **fields):
        """Submits a job. `spec` is a JobSpec, a dict in the protobuf JSON mapping of the type's
        spec (e.g. ExtractSpec), or None; extra fields (num_devices, priority, label) go on the
        JobSpec."""
        job_spec = jobs_pb2.JobSpec(type=jobs_pb2.JobType.Value(job_type), **fields)
        if isinstance(spec, jobs_pb2.JobSpec):
            job_spec.MergeFrom(spec)
        elif isinstance(spec, dict):
            inner = {"PROBE": job_spec.probe, "EXTRACT": job_spec.extract,
                     "TRAIN": job_spec.train}[job_type]
            json_format.ParseDict(spec, inner)
        elif spec is not None:
            getattr(job_spec, job_type.lower()).CopyFrom(spec)
        request = jobs_pb2.SubmitJobRequest(request_id=request_id, spec=job_spec)
        return self.jobs.SubmitJob(request, metadata=self.metadata, timeout=self.timeout)

    def get(self, job_id):
        return self.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job_id), metadata=self.metadata,
                                timeout=self.timeout)

    def list(self, state=None, job_type=None, page_size=0):
        """All jobs, newest first, following page tokens."""
        token = ""
        while True:
            request = jobs_pb2.ListJobsRequest(page_size=page_size, page_token=token)
            if state:
                request.state = jobs_pb2.JobState.Value(state)
            if job_type:
                request.type = jobs_pb2.JobType.Value(job_type)
            response = self.jobs.ListJobs(request, metadata=self.metadata, timeout=self.timeout)
            yield from response.jobs
            token = response.next_page_token
            if not token:
                return

    def watch(self, job_id, after_sequence=0):
        """Events of a job, from after_sequence on, until it ends."""
        request = jobs_pb2.WatchJobRequest(job_id=job_id, after_sequence=after_sequence)
        return self.jobs.WatchJob(request, metadata=self.metadata)

    def wait(self, job_id):
        """Blocks until the job ends; returns its final record."""
        for _ in self.watch(job_id):
            pass
        return self.get(job_id)

    def cancel(self, job_id):
        return self.jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=job_id),
                                   metadata=self.metadata, timeout=self.timeout)

    def list_devices(self):
        return self.devices.ListDevices(devices_pb2.ListDevicesRequest(), metadata=self.metadata,
                                        timeout=self.timeout).devices

    def read_rows(self, dataset_id, row_start=0, row_count=0):
        """Rows as (scipy.sparse.csr_matrix, numpy token ids)."""
        import numpy as np
        import scipy.sparse

        request = datasets_pb2.ReadRowsRequest(dataset_id=dataset_id, row_start=row_start,
                                               row_count=row_count)
        data, indices, indptr, tokens = [], [], [0], []
        cols = 0
        for piece in self.datasets.ReadRows(request, metadata=self.metadata):
            base = indptr[-1]
            data.extend(piece.values)
            indices.extend(piece.indices)
            indptr.extend(base + p for p in piece.indptr[1:])
            tokens.extend(piece.token_ids)
            cols = piece.num_cols
        matrix = scipy.sparse.csr_matrix(
            (np.asarray(data, np.float32), np.asarray(indices, np.int32),
             np.asarray(indptr, np.int64)), shape=(len(indptr) - 1, cols))
        return matrix, np.asarray(tokens, np.int32)

    def get_latent(self, dataset_id, latent, top_n=20, context_before=32, context_after=8,
                   intervals=0, interval_samples=5):
        """Statistics, top rows with context and, with intervals > 0, interval samples: the value
        range cut into that many equal intervals, each with its count and a few of its rows."""
        request = datasets_pb2.GetLatentRequest(dataset_id=dataset_id, latent=latent, top_n=top_n,
                                                context_before=context_before,
                                                context_after=context_after, intervals=intervals,
                                                interval_samples=interval_samples)
        return self.datasets.GetLatent(request, metadata=self.metadata, timeout=self.timeout)
