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

import re
import warnings

import grpc
from google.protobuf import json_format

from latentd.v1 import datasets_pb2, datasets_pb2_grpc
from latentd.v1 import devices_pb2, devices_pb2_grpc
from latentd.v1 import jobs_pb2, jobs_pb2_grpc

TERMINAL_STATES = (jobs_pb2.SUCCEEDED, jobs_pb2.FAILED, jobs_pb2.CANCELLED)


def _spans_of_rows(rows):
    """Row indices (any order, repeats allowed) or a boolean mask as ascending (start, count)
    runs of consecutive rows, as LatentsOnRows takes them."""
    import numpy as np
    rows = np.asarray(rows)
    if rows.dtype == np.bool_:
        rows = np.flatnonzero(rows)
    rows = np.unique(rows.astype(np.int64, copy=False))
    if rows.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    starts = rows[np.concatenate(([0], breaks))]
    ends = rows[np.concatenate((breaks - 1, [rows.size - 1]))] + 1
    return list(zip(starts.tolist(), (ends - starts).tolist()))


def _merged_spans(row_ranges):
    """(start, count) pairs sorted, with overlapping or touching ones merged."""
    merged = []
    for start, count in sorted((int(s), int(n)) for s, n in row_ranges):
        if count < 1:
            raise ValueError("row_ranges: (%d, %d) holds no row" % (start, count))
        if merged and start <= merged[-1][0] + merged[-1][1]:
            first = merged[-1][0]
            merged[-1] = (first, max(merged[-1][1], start + count - first))
        else:
            merged.append((start, count))
    return merged


def _set_row_ranges(message, spans):
    """Fills a RowRanges message with (start, count) spans (set even when there are none)."""
    message.SetInParent()
    for start, count in spans:
        message.ranges.add(start=start, count=count)


def _spans_of(rows, row_ranges, sequences, context_length):
    """(start, count) row spans, ascending and merged, of one of the three forms
    latents_on_rows takes (sequences scaled by context_length)."""
    if sequences is not None:
        return [(s * context_length, n * context_length) for s, n in _spans_of_rows(sequences)]
    return _spans_of_rows(rows) if rows is not None else _merged_spans(row_ranges)


def _batches_of(messages, max_bytes):
    """`messages` cut in order into lists of at most max_bytes serialized (one larger is a list
    alone); one empty list for none, so that a call is still made."""
    batches, size = [[]], 0
    for m in messages:
        if batches[-1] and size + m.ByteSize() > max_bytes:
            batches.append([])
            size = 0
        batches[-1].append(m)
        size += m.ByteSize()
    return batches


def _delphi_score(verdicts):
    """The balanced accuracy of a classifier scorer's verdicts (delphi's ClassifierOutput
    records: "activating" the truth, "prediction" a boolean, 0/1, or null/-1 unanswered) over
    the answered ones; None where none was answered."""
    counts = {}
    for i, record in enumerate(verdicts):
        if not isinstance(record, dict) or not isinstance(record.get("activating"), bool):
            raise ValueError('record %d has no boolean "activating" (not a detection or fuzz '
                             "scorer's)" % i)
        prediction = record.get("prediction")
        if prediction not in (True, False):  # 0 and 1 compare equal to them
            continue
        truth = record["activating"]
        hits, n = counts.get(truth, (0, 0))
        counts[truth] = (hits + (bool(prediction) == truth), n + 1)
    if not counts:
        return None
    return sum(hits / n for hits, n in counts.values()) / len(counts)


def delphi_explanations(path, module=None, scores=None):
    """The explanations an EleutherAI delphi run wrote, as records for set_explanations. `path`
    is the run's directory (explanations/, scores/) or an explanations directory; `module` the
    module read where the files cover several (latentctl's delphi export names each dataset's
    module by its hook: pass get_dataset(id).hook_name). Each explanation is scored by the
    balanced accuracy of a classifier scorer's verdicts where it has them: `scores` is a scorer
    under the run's scores/ or a directory (default detection, else fuzz); source "delphi", or
    "delphi/<scorer>" when scored. What latentctl explain reads from a directory."""
    import json
    import os
    name = re.compile(r"(?:(.*)_)?latent(\d+)\.txt")

    def latent_files(directory):
        files = {}
        for entry in sorted(os.listdir(directory)):
            match = name.fullmatch(entry)
            if match and os.path.isfile(os.path.join(directory, entry)):
                files.setdefault(match.group(1) or "", {})[int(match.group(2))] = \
                    os.path.join(directory, entry)
        return files

    whole_run = os.path.isdir(os.path.join(path, "explanations"))
    explained = latent_files(os.path.join(path, "explanations") if whole_run else path)
    if scores:
        candidates = ([os.path.join(path, "scores", scores)] if whole_run else []) + [scores]
    elif whole_run:
        candidates = [os.path.join(path, "scores", s) for s in ("detection", "fuzz")]
    else:
        candidates = []
    scores_dir = next((c for c in candidates if os.path.isdir(c)), None)
    if scores and scores_dir is None:
        raise FileNotFoundError("scores: %s is neither a directory nor a scorer under %s" %
                                (scores, os.path.join(path, "scores")))
    if module is None:
        if len(explained) > 1:
            raise ValueError("the latent files are of %d modules (%s): name one with module=" %
                             (len(explained), ", ".join(sorted(explained))))
        module = next(iter(explained), "")
    elif module not in explained:
        raise ValueError("module: no latent files of %s (the modules there: %s)" %
                         (module, ", ".join(sorted(explained)) or "none"))
    scored = latent_files(scores_dir).get(module, {}) if scores_dir else {}
    scorer = os.path.basename(os.path.normpath(scores_dir)) if scores_dir else None
    records = []
    for latent, file in sorted(explained.get(module, {}).items()):
        with open(file, encoding="utf-8") as f:
            text = json.load(f)
        if not isinstance(text, str):
            raise ValueError("%s: not a JSON string (delphi's explanation file)" % file)
        record = {"latent": latent, "text": text, "source": "delphi"}
        if latent in scored:
            with open(scored[latent], encoding="utf-8") as f:
                verdicts = json.load(f)
            if not isinstance(verdicts, list):
                raise ValueError("%s: not a JSON array of a classifier scorer's records" %
                                 scored[latent])
            try:
                score = _delphi_score(verdicts)
            except ValueError as e:
                raise ValueError("%s: %s" % (scored[latent], e)) from None
            if score is not None:
                record.update(score=score, source="delphi/" + scorer)
        records.append(record)
    return records


class Output:
    """A value of a job's result that does not exist yet: put it in a spec dict where the value
    goes, and the job waits for that job and takes the value once it has succeeded (a
    pipeline; if it fails, the waiting job fails with reason DEPENDENCY_FAILED):

        dense = c.submit("EXTRACT", {... "mode": "DENSE"})
        sae = c.submit("TRAIN", {"datasetId": Output(dense, "extract.dataset_id"), ...})
        c.submit("EXTRACT", {"sae": {"artifactId": Output(sae, "train.artifact_id")}, ...})

    `job` is a Job (as submit returns it) or a job id; `path` names a field of its JobResult."""

    def __init__(self, job, path):
        self.job_id = job if isinstance(job, int) else job.id
        self.path = path

    def __repr__(self):
        return "Output(job %d, %r)" % (self.job_id, self.path)


def _take_outputs(value, path, bindings):
    """`value` (a spec dict or list, in the JSON mapping) without its Output placeholders, each
    recorded in `bindings` as (field path, Output). A list gets its Outputs appended after its
    plain values, so they must come last."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if isinstance(item, Output):
                bindings.append((path + "." + key, item))
            else:
                out[key] = _take_outputs(item, path + "." + key, bindings)
        return out
    if isinstance(value, list):
        out = []
        for i, item in enumerate(value):
            if isinstance(item, Output):
                if any(not isinstance(rest, Output) for rest in value[i:]):
                    raise ValueError("%s: an Output is appended to its list when the job starts, "
                                     "so plain values must come before every Output" % path)
                bindings.append((path, item))
            else:
                out.append(_take_outputs(item, "%s.%d" % (path, len(out)), bindings))
        return out
    return value


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
        spec (e.g. ExtractSpec), or None; extra fields (num_devices, priority, label,
        after_job_ids) go on the JobSpec. Output placeholders in the dict make a pipeline: the
        job waits for their jobs and takes the values from their results once they succeed."""
        request = jobs_pb2.SubmitJobRequest(request_id=request_id,
                                            spec=self._job_spec(job_type, spec, fields))
        return self.jobs.SubmitJob(request, metadata=self.metadata, timeout=self.timeout)

    def plan(self, job_type, spec=None, **fields):
        """A dry run of submit: the same checks (errors raise as submit's do), and the lines
        saying what the job would do (tokens and rows, model, each dataset's hook and how its
        SAE is read, disk and memory); no job is created."""
        request = jobs_pb2.SubmitJobRequest(spec=self._job_spec(job_type, spec, fields))
        return list(self.jobs.PlanJob(request, metadata=self.metadata, timeout=self.timeout).lines)

    @staticmethod
    def _job_spec(job_type, spec, fields):
        job_spec = jobs_pb2.JobSpec(type=jobs_pb2.JobType.Value(job_type), **fields)
        if isinstance(spec, jobs_pb2.JobSpec):
            job_spec.MergeFrom(spec)
        elif isinstance(spec, dict):
            inner = getattr(job_spec, job_type.lower())  # the type's oneof member
            bindings = []
            json_format.ParseDict(_take_outputs(spec, job_type.lower(), bindings), inner)
            inner.SetInParent()  # a spec whose every value is bound is still this type's
            for field, output in bindings:
                job_spec.bindings.add(job_id=output.job_id, output=output.path, field=field)
                if output.job_id not in job_spec.after_job_ids:
                    job_spec.after_job_ids.append(output.job_id)
        elif spec is not None:
            getattr(job_spec, job_type.lower()).CopyFrom(spec)
        return job_spec

    def get(self, job_id):
        return self.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job_id), metadata=self.metadata,
                                timeout=self.timeout)

    def list(self, state=None, job_type=None, page_size=0, label=""):
        """All jobs (or those of a state, type or label), newest first, following page tokens."""
        token = ""
        while True:
            request = jobs_pb2.ListJobsRequest(page_size=page_size, page_token=token, label=label)
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

    def train_telemetry(self, job_id):
        """A TRAIN job's telemetry samples, in step order, as dicts of plain numbers ready for a
        plot or a DataFrame: the TrainTelemetry fields under their proto names, with
        optimizer_state_bytes a dict by component and, for a Matryoshka SAE, prefix_fvu a dict
        {width: fvu}. Waits for the job to end if it is still running (as `latentctl telemetry`
        does)."""
        samples = []
        for event in self.watch(job_id):
            if not (event.HasField("telemetry") and event.telemetry.HasField("train")):
                continue
            t = event.telemetry.train
            sample = {field.name: getattr(t, field.name) for field in t.DESCRIPTOR.fields
                      if field.name not in ("optimizer_state_bytes", "prefix_fvu",
                                            "prefix_widths")}
            sample["optimizer_state_bytes"] = dict(t.optimizer_state_bytes)
            sample["prefix_fvu"] = dict(zip(t.prefix_widths, t.prefix_fvu))
            samples.append(sample)
        return sorted(samples, key=lambda s: s["step"])

    def cancel(self, job_id):
        return self.jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=job_id),
                                   metadata=self.metadata, timeout=self.timeout)

    def delete_job(self, job_id):
        """Forgets a finished job: its record, events and a TRAIN job's checkpoint."""
        self.jobs.DeleteJob(jobs_pb2.DeleteJobRequest(job_id=job_id),
                            metadata=self.metadata, timeout=self.timeout)

    def list_devices(self):
        return self.devices.ListDevices(devices_pb2.ListDevicesRequest(), metadata=self.metadata,
                                        timeout=self.timeout).devices

    def list_datasets(self):
        """Every dataset's DatasetInfo (rows committed, nnz, density, dead latents, bytes...).

        A dataset whose metadata is damaged is left out with a warning naming it and the error
        (delete_dataset removes it)."""
        response = self.datasets.ListDatasets(datasets_pb2.ListDatasetsRequest(),
                                              metadata=self.metadata, timeout=self.timeout)
        for u in response.unreadable:
            warnings.warn("dataset %d (%s) is unreadable: %s" % (u.dataset_id, u.name or "?",
                                                                 u.error), stacklevel=2)
        return response.datasets

    def get_dataset(self, dataset_id):
        return self.datasets.GetDataset(datasets_pb2.GetDatasetRequest(dataset_id=dataset_id),
                                        metadata=self.metadata, timeout=self.timeout)

    def export(self, dataset_id, path, format="npz", row_start=0, row_count=0, splits=0,
               timeout=None, job=False, **fields):
        """Writes rows on the server under its export root (path relative to it, or absolute
        inside it) as "npz" (scipy.sparse.load_npz reads it), "hdf5", "parquet" (a row a row:
        row, token_id, latents and values lists; pandas, polars, DuckDB) or "delphi" (path is a
        latent cache directory EleutherAI's delphi reads, the dataset its module path/<hook>,
        in `splits` files, delphi's 5 by default; whole sequences only); returns the response
        with the absolute path written. The server streams the rows in bounded memory, so this
        waits as long as the export takes unless `timeout` (seconds) is given; an export that
        runs past it, or whose caller is interrupted, stops and leaves no file.

        job=True submits the same export as an EXPORT job and returns the Job at once: its
        progress (rows) shows on watch() and dashboards, cancel() stops it, and dataset_id may
        be an Output of a job it then waits for (c.export(Output(extract, "extract.dataset_id"),
        "x.npz", job=True)); `fields` (priority, label, after_job_ids) go on its JobSpec."""
        formats = {"npz": datasets_pb2.NPZ, "hdf5": datasets_pb2.HDF5,
                   "parquet": datasets_pb2.EXPORT_FORMAT_PARQUET,
                   "delphi": datasets_pb2.EXPORT_FORMAT_DELPHI}
        if format not in formats:
            raise ValueError("format must be one of %s, not %r" % (sorted(formats), format))
        if job:
            spec = {"dataset_id": dataset_id, "path": path,
                    "format": datasets_pb2.ExportFormat.Name(formats[format]),
                    "row_start": row_start, "row_count": row_count, "delphi_splits": splits}
            return self.submit("EXPORT", spec, **fields)
        if fields:
            raise TypeError("export: %s only with job=True" % ", ".join(sorted(fields)))
        request = datasets_pb2.ExportDatasetRequest(dataset_id=dataset_id, path=path,
                                                    format=formats[format], row_start=row_start,
                                                    row_count=row_count, delphi_splits=splits)
        return self.datasets.ExportDataset(request, metadata=self.metadata, timeout=timeout)

    def delete_dataset(self, dataset_id):
        self.datasets.DeleteDataset(datasets_pb2.DeleteDatasetRequest(dataset_id=dataset_id),
                                    metadata=self.metadata, timeout=self.timeout)

    def list_artifacts(self):
        """Trained SAEs (TRAIN jobs' outputs): a list of Artifact messages.

        A record that does not parse is left out with a warning naming it."""
        response = self.datasets.ListArtifacts(datasets_pb2.ListArtifactsRequest(),
                                               metadata=self.metadata, timeout=self.timeout)
        for u in response.unreadable:
            warnings.warn("artifact %d is unreadable: %s" % (u.artifact_id, u.error),
                          stacklevel=2)
        return list(response.artifacts)

    def delete_artifact(self, artifact_id):
        """Deletes a trained SAE's record and files; returns the bytes freed.

        FAILED_PRECONDITION (grpc.RpcError) while an unfinished job uses it."""
        return self.datasets.DeleteArtifact(
            datasets_pb2.DeleteArtifactRequest(artifact_id=artifact_id),
            metadata=self.metadata, timeout=self.timeout).bytes_freed

    def read_rows(self, dataset_id, row_start=0, row_count=0, packed=True):
        """Rows as (scipy.sparse.csr_matrix of float32, numpy int32 token ids).

        packed (the default) asks for pieces of little-endian byte strings (16-bit indices and
        values for fp16/bf16 datasets of <= 65536 latents), turned into arrays by
        numpy.frombuffer; packed=False reads the repeated fields element by element (slower)."""
        import numpy as np
        import scipy.sparse

        request = datasets_pb2.ReadRowsRequest(dataset_id=dataset_id, row_start=row_start,
                                               row_count=row_count, packed=packed)
        data, indices, indptr, tokens = [], [], [np.zeros(1, np.int64)], []
        base, cols = 0, 0
        for piece in self.datasets.ReadRows(request, metadata=self.metadata):
            cols = piece.num_cols
            if packed:
                offsets, piece_indices, values, piece_tokens = _unpack(piece.packed)
            else:
                offsets = np.fromiter(piece.indptr, np.int64, len(piece.indptr))
                piece_indices = np.fromiter(piece.indices, np.int32, len(piece.indices))
                values = np.fromiter(piece.values, np.float32, len(piece.values))
                piece_tokens = np.fromiter(piece.token_ids, np.int32, len(piece.token_ids))
            indptr.append(offsets[1:] + base)
            base += int(offsets[-1])
            indices.append(piece_indices)
            data.append(values)
            tokens.append(piece_tokens)
        indptr = np.concatenate(indptr)
        matrix = scipy.sparse.csr_matrix(
            (_concat(data, np.float32), _concat(indices, np.int32), indptr),
            shape=(len(indptr) - 1, cols))
        return matrix, _concat(tokens, np.int32)

    def get_latent(self, dataset_id, latent, top_n=20, context_before=32, context_after=8,
                   intervals=0, interval_samples=5, distinct_sequences=False, top_tokens=0,
                   positions=False, silent_samples=0, silent_seed=0):
        """Statistics, top rows with context and, with intervals > 0, interval samples: the value
        range cut into that many equal intervals, each with its count and a few of its rows.
        distinct_sequences=True: the top sequences instead, one row each (its largest value).
        Each example's window comes as context_token_ids with the latent's value on each token in
        context_values (0 where it does not fire): decode the ids with your tokenizer, e.g.
        tokenizer.convert_ids_to_tokens(example.context_token_ids), and shade by the values.
        top_tokens > 0: also the tokens it fires on most (token_id, count, fraction, mean).
        positions=True: also position_histogram (firings by place in the sequence, bins of
        position_bin_width positions). silent_samples > 0: also `silent`, that many windows drawn
        at random (reproducibly, by silent_seed) where the latent fires on no token: the
        non-activating examples an explanation is scored against."""
        request = datasets_pb2.GetLatentRequest(dataset_id=dataset_id, latent=latent, top_n=top_n,
                                                context_before=context_before,
                                                context_after=context_after, intervals=intervals,
                                                interval_samples=interval_samples,
                                                distinct_sequences=distinct_sequences,
                                                top_tokens=top_tokens, positions=positions,
                                                silent_samples=silent_samples,
                                                silent_seed=silent_seed)
        return self.datasets.GetLatent(request, metadata=self.metadata, timeout=self.timeout)

    def latent_firings(self, dataset_id, latent, row_start=0, row_count=0, token_ids=False):
        """Every row where the latent fires, ascending, and its value there: (rows int64,
        values float32) numpy arrays, read latent-major (the latent's runs only, streamed), and
        with token_ids=True a third array, each firing row's token id. E.g. its activation over
        the dataset: a = np.zeros(n); a[rows] = values."""
        import numpy as np

        request = datasets_pb2.ReadLatentFiringsRequest(
            dataset_id=dataset_id, latent=latent, row_start=row_start, row_count=row_count,
            token_ids=token_ids)
        rows, values, tokens = [], [], []
        for piece in self.datasets.ReadLatentFirings(request, metadata=self.metadata):
            rows.append(np.frombuffer(piece.rows, "<i8"))
            values.append(np.frombuffer(piece.values, "<f4"))
            tokens.append(np.frombuffer(piece.token_ids, "<i4"))
        out = (_concat(rows, np.int64), _concat(values, np.float32))
        return out + (_concat(tokens, np.int32),) if token_ids else out

    _LATENT_ORDERS = {"latent": "BY_LATENT", "frequent": "MOST_FREQUENT", "rare": "LEAST_FREQUENT",
                      "max": "HIGHEST_MAX", "mean": "HIGHEST_MEAN"}

    def list_latents(self, dataset_id, order="latent", limit=100, offset=0, min_firing_count=0,
                     max_firing_count=None, density_bins=50):
        """The SAE at a glance from its stored statistics (never the rows): a page of latents in
        `order` ("latent", "frequent", "rare", "max", "mean"; ties by latent index) whose firing
        count lies in [min_firing_count, max_firing_count] (None: no bound; 0 lists the dead
        latents), with rows, d_sae, dead_latents, matching and the log10 density histogram
        (log10_density_min, log10_density_histogram over [log10_density_min, 0])."""
        if order not in self._LATENT_ORDERS:
            raise ValueError("order must be one of %s, not %r" % (sorted(self._LATENT_ORDERS),
                                                                  order))
        request = datasets_pb2.ListLatentsRequest(
            dataset_id=dataset_id, order=datasets_pb2.LatentOrder.Value(self._LATENT_ORDERS[order]),
            limit=limit, offset=offset, min_firing_count=min_firing_count,
            density_bins=density_bins)
        if max_firing_count is not None:
            request.max_firing_count = max_firing_count
        return self.datasets.ListLatents(request, metadata=self.metadata, timeout=self.timeout)

    def latents_on_rows(self, dataset_id, with_latent=None, token_id=None, rows=None,
                        row_ranges=None, order="count", limit=20, max_rows=0, min_count=0,
                        in_dataset=0, versus_rows=None, versus_row_ranges=None,
                        sequences=None, versus_sequences=None):
        """The latents firing on a set of rows; give one of: `with_latent` (the rows where it
        fires: what fires with it; it is left out), `token_id` (the rows holding it: what the SAE
        sees in that token), `rows` (row indices in any order, or a boolean mask over the rows),
        `row_ranges` ((start, count) pairs; they may overlap) or `sequences` (sequence indices in
        any order, or a boolean mask over the sequences: the documents you labelled, each the
        dataset's context_length rows).

        Ranked by "count" (firings there), "lift" (their rate there over the latent's density
        in the whole dataset: what is enriched there) or "f1" (the latent as a detector of the
        rows: the harmonic mean of fraction, its recall, and precision, the share of all its
        firings that lie there; with_latent=j: the latents most nearly j). The answer holds
        rows_selected, rows_read (at most max_rows, 0: 2048, taken from chunks spread over the
        dataset) and latents with latent, count, fraction, mean, lift, precision, f1.
        in_dataset: count that dataset's latents on the selected rows instead (another output of
        the same EXTRACT job, e.g. another layer, or any dataset over the same tokens).

        With rows, row_ranges or sequences, `versus_rows`, `versus_row_ranges` or
        `versus_sequences` (the same forms) name rows to contrast them with, your negatives:
        each latent then also carries versus_count, versus_fraction and versus_mean, and
        order="difference" ranks by fraction minus versus_fraction, the latents that tell the
        two sets apart."""
        given = [x is not None for x in (with_latent, token_id, rows, row_ranges, sequences)]
        if sum(given) != 1:
            raise ValueError("give exactly one of with_latent, token_id, rows, row_ranges and "
                             "sequences")
        orders = {"count": datasets_pb2.BY_COUNT, "lift": datasets_pb2.BY_LIFT,
                  "f1": datasets_pb2.BY_F1, "difference": datasets_pb2.BY_DIFFERENCE}
        if order not in orders:
            raise ValueError("order must be 'count', 'lift', 'f1' or 'difference', not %r"
                             % (order,))
        versus = [x is not None for x in (versus_rows, versus_row_ranges, versus_sequences)]
        if sum(versus) > 1:
            raise ValueError("give at most one of versus_rows, versus_row_ranges and "
                             "versus_sequences")
        if any(versus) and (with_latent is not None or token_id is not None):
            raise ValueError("versus_rows / versus_row_ranges / versus_sequences contrast rows, "
                             "row_ranges or sequences")
        if order == "difference" and not any(versus):
            raise ValueError("order='difference' needs versus_rows, versus_row_ranges or "
                             "versus_sequences")
        request = datasets_pb2.LatentsOnRowsRequest(
            dataset_id=dataset_id, order=orders[order], limit=limit, max_rows=max_rows,
            min_count=min_count, in_dataset_id=in_dataset)
        if with_latent is not None:
            request.with_latent = with_latent
        elif token_id is not None:
            request.token_id = token_id
        else:
            context_length = self._context_length(dataset_id, sequences, versus_sequences)
            _set_row_ranges(request.row_ranges,
                            _spans_of(rows, row_ranges, sequences, context_length))
            if any(versus):
                _set_row_ranges(request.versus_row_ranges,
                                _spans_of(versus_rows, versus_row_ranges, versus_sequences,
                                          context_length))
        return self.datasets.LatentsOnRows(request, metadata=self.metadata, timeout=self.timeout)

    def project_rows(self, dataset_id, direction, cosine=False, top_n=20,
                     distinct_sequences=False, context_before=32, context_after=8, row_start=0,
                     row_count=0, bins=50):
        """A direction (a steering vector, a probe's weights, an SAE latent's decoder row: d_in
        numbers) projected on every row of a DENSE dataset, computed where the rows lie: the
        response has rows, mean, stddev, min, max, a histogram (bins of bin_width from min) and
        the rows at both ends, largest and smallest, each a TopActivation with its context
        window (context_values: the projection of each window row). cosine=True ranks by
        cos(x, direction), so that rows of outsized norm do not crowd the top;
        distinct_sequences keeps one row per sequence at each end. grpc.RpcError
        INVALID_ARGUMENT when the direction is not d_in finite values, not all zero."""
        import numpy as np
        request = datasets_pb2.ProjectRowsRequest(
            dataset_id=dataset_id,
            direction=np.asarray(direction, dtype=np.float32).ravel().tolist(),
            measure=datasets_pb2.PROJECTION_COSINE if cosine else datasets_pb2.PROJECTION_DOT,
            top_n=top_n, distinct_sequences=distinct_sequences, context_before=context_before,
            context_after=context_after, row_start=row_start, row_count=row_count, bins=bins)
        return self.datasets.ProjectRows(request, metadata=self.metadata, timeout=self.timeout)

    def sparse_probe(self, dataset_id, rows=None, row_ranges=None, sequences=None,
                     versus_rows=None, versus_row_ranges=None, versus_sequences=None,
                     ks=(1, 2, 5, 10, 20), test_fraction=0.25, seed=0, l2=1.0, pool=None,
                     select="fraction", max_rows=0, balanced=False):
        """k-sparse probing (as SAEBench evaluates SAEs): how well k latents tell your positive
        rows from your negatives, for each k in ks, computed by the daemon where the rows lie
        (none cross the wire). Positives and negatives take the forms of latents_on_rows (rows,
        row_ranges or sequences; versus_...); no row may be in both. Their spans (runs of
        consecutive rows, or with pooling each sequence) are split at random (seed) into train
        and test, test_fraction of each class's held out, so that no span lends rows to both.
        The latents are chosen on the train examples alone, by their largest difference
        between the classes, either sign (a marker of the negatives counts too):
        select="fraction" of the shares of rows they fire on, select="mean" of their mean
        values (over the examples as fitted, pooled or not, as SAEBench selects); then an
        L2-penalized logistic regression (l2, scikit-learn's 1 / C, on standardized values) on
        the first k of them is fitted on the train examples and scored on the test ones. pool="mean" or "max" (both
        classes given as sequences, or as rows that are whole sequences): each sequence is one
        example, its latent values pooled over its rows, as SAEBench classifies documents.
        max_rows (0: 2^20, at most 2^24) caps the rows of both classes. balanced=True weighs
        each class by n / (2 n_class) in the fit (scikit-learn's class_weight="balanced"), so
        that a rare label is not traded away for the majority's accuracy.

        A dict: k, train_accuracy, test_accuracy, test_precision, test_recall, test_f1 and
        test_balanced_accuracy (the mean of the recalls on both classes: 0.5 for a probe that
        calls everything one class, however rare the other) as numpy arrays, one entry per k;
        latents (the chosen latents, best first), weights (per k: the logistic weight of each
        of its latents, per unit of latent value) and intercepts, examples (train_positive,
        train_negative, test_positive, test_negative: rows, or sequences when pooled),
        rows_read, and test_row_ranges / test_versus_row_ranges (the (start, count) spans held
        out: where to look for the probe's mistakes). grpc.RpcError INVALID_ARGUMENT when a
        class has fewer than two spans (one for each side) or a row is in both classes."""
        import numpy as np

        pools = {None: datasets_pb2.POOL_NONE, "mean": datasets_pb2.POOL_MEAN,
                 "max": datasets_pb2.POOL_MAX}
        selects = {"fraction": datasets_pb2.SELECT_BY_FRACTION,
                   "mean": datasets_pb2.SELECT_BY_MEAN}
        if select not in selects:
            raise ValueError("select must be 'fraction' or 'mean', not %r" % (select,))
        if pool not in pools:
            raise ValueError("pool must be None, 'mean' or 'max', not %r" % (pool,))
        if not l2 > 0:
            raise ValueError("l2 must be above 0 (the fit needs the penalty), not %r" % (l2,))
        forms = ((rows, row_ranges, sequences), (versus_rows, versus_row_ranges, versus_sequences))
        for form, name in zip(forms, ("rows", "versus_rows")):
            if sum(x is not None for x in form) != 1:
                raise ValueError("give one of %s, %s and %s" % (
                    name, name.replace("rows", "row_ranges"), name.replace("rows", "sequences")))
        context_length = self._context_length(dataset_id, sequences, versus_sequences)
        request = datasets_pb2.SparseProbeRequest(
            dataset_id=dataset_id, ks=[int(k) for k in ks], test_fraction=test_fraction,
            seed=seed, l2=l2, pool=pools[pool], select=selects[select], max_rows=max_rows,
            balanced=balanced)
        _set_row_ranges(request.row_ranges, _spans_of(*forms[0], context_length))
        _set_row_ranges(request.versus_row_ranges, _spans_of(*forms[1], context_length))
        answer = self.datasets.SparseProbe(request, metadata=self.metadata, timeout=self.timeout)
        fits = answer.fits
        out = {field: np.array([getattr(f, field) for f in fits])
               for field in ("k", "train_accuracy", "test_accuracy", "test_precision",
                             "test_recall", "test_f1", "test_balanced_accuracy")}
        out["weights"] = [np.array(f.weights) for f in fits]
        out["intercepts"] = np.array([f.intercept for f in fits])
        out["latents"] = np.array(answer.latents, np.int64)
        out["examples"] = {"train_positive": answer.train_positive,
                           "train_negative": answer.train_negative,
                           "test_positive": answer.test_positive,
                           "test_negative": answer.test_negative}
        out["rows_read"] = answer.rows_read
        out["test_row_ranges"] = [(r.start, r.count) for r in answer.test_row_ranges.ranges]
        out["test_versus_row_ranges"] = [(r.start, r.count)
                                         for r in answer.test_versus_row_ranges.ranges]
        return out

    def show_sparse_probe(self, dataset_id, **probe_args):
        """sparse_probe's answer as a SparseProbeView, which a notebook shows as held-out
        accuracy and F1 (and train accuracy) against k, then a row per k with its latents."""
        return SparseProbeView(self.sparse_probe(dataset_id, **probe_args))

    def _context_length(self, dataset_id, *sequence_forms):
        """The dataset's context_length when any of sequence_forms is given (ValueError for a
        dataset without sequences), else 1 (no call)."""
        if all(form is None for form in sequence_forms):
            return 1
        context_length = self.get_dataset(dataset_id).context_length
        if context_length < 1:
            raise ValueError("sequences: dataset %d has no sequences" % dataset_id)
        return context_length

    def set_explanations(self, dataset_id, explanations, source="", replace_all=False):
        """Stores what latents stand for (auto-interpretation's output, or your own notes): a
        dict {latent: text}, or dicts with latent, text and optionally score and source (delphi's
        records name the text "explanation", taken too). `source` fills those that name none;
        replace_all removes the dataset's earlier explanations in the same write. All or none is
        stored (grpc.RpcError INVALID_ARGUMENT naming explanations[i] otherwise; past 8 MiB of
        them, all or none of each 8 MiB call); get_latent then carries each latent's, and
        dashboards show them. The response: stored, explained."""
        items = ([{"latent": l, "text": t} for l, t in explanations.items()]
                 if isinstance(explanations, dict) else explanations)
        messages = []
        for item in items:
            e = datasets_pb2.LatentExplanation(
                latent=int(item["latent"]), text=item.get("text", item.get("explanation", "")),
                source=item.get("source") or source)
            if item.get("score") is not None:
                e.score = float(item["score"])
            messages.append(e)
        # Calls of at most 8 MiB (the daemon takes 16 MiB a message), each stored whole;
        # replace_all goes with the first.
        batches = _batches_of(messages, 8 << 20)
        stored = 0
        for batch in batches:
            request = datasets_pb2.SetExplanationsRequest(
                dataset_id=dataset_id, replace_all=replace_all and batch is batches[0],
                explanations=batch)
            answer = self.datasets.SetExplanations(request, metadata=self.metadata,
                                                   timeout=self.timeout)
            stored += answer.stored
        answer.stored = stored
        return answer

    def copy_explanations(self, dataset_id, from_dataset, replace_all=False):
        """Copies every explanation of dataset from_dataset into dataset_id, in one write by
        the daemon: an explanation belongs to a latent of an SAE, so a dataset the same SAE
        encoded from other tokens takes them over (grpc.RpcError FAILED_PRECONDITION naming
        both SAEs otherwise). replace_all removes dataset_id's earlier explanations in the same
        write. The response: stored (copied), explained."""
        request = datasets_pb2.SetExplanationsRequest(
            dataset_id=dataset_id, from_dataset_id=from_dataset, replace_all=replace_all)
        return self.datasets.SetExplanations(request, metadata=self.metadata,
                                             timeout=self.timeout)

    def search_explanations(self, dataset_id, query="", limit=20):
        """The latents whose explanations hold every word of `query` (any case, anywhere:
        "fren" finds "French"; empty: all), scored ones first by score, then by latent. The
        response: explained, matched, explanations (latent, text, score when set, source)."""
        request = datasets_pb2.SearchExplanationsRequest(dataset_id=dataset_id, query=query,
                                                         limit=limit)
        return self.datasets.SearchExplanations(request, metadata=self.metadata,
                                                timeout=self.timeout)

    def latent_weights(self, dataset_id, latent, top_n=10, unembedding="", decoder=False):
        """What the latent's weights say, from the SAE and model that made the dataset (no rows):
        neighbors (the top_n latents with the nearest decoder directions: latent, cosine),
        positive_logits / negative_logits (the tokens its decoder direction raises and lowers
        most through the model's unembedding: token_id, logit), decoder_norm, encoder_norm,
        encoder_decoder_cosine. logits_source names the unembedding used; for a TorchScript
        model without a usual one, name its parameter in `unembedding` (logits_unavailable says
        why there are no logits). For a latent of a cross-layer transcoder,
        decoder_norm_by_layer (layer, norm) says where it writes, and the logits unembed the sum
        of its decoders. For a crosscoder's latent, decoder_by_source (hook_name, norm at the
        training scale, share, cosine_with_first) says how its decoder splits between the
        sources (model diffing: a share near 1 is that model's own latent), each with the logits
        of its block through its own model's unembedding. decoder=True adds the decoder row
        itself, W_dec[latent] (response.decoder; a direction for project_rows or steering)."""
        request = datasets_pb2.GetLatentWeightsRequest(dataset_id=dataset_id, latent=latent,
                                                       top_n=top_n, unembedding=unembedding,
                                                       include_decoder=decoder)
        return self.datasets.GetLatentWeights(request, metadata=self.metadata,
                                              timeout=self.timeout)

    def encode_prompt(self, dataset_id, token_ids, latents_per_token=10, top_latents=20):
        """The latents a new prompt gets from the model and SAE that made the dataset, encoded
        as EXTRACT encoded its sequences (bos_prepended says whether BOS went first, as the
        dataset's spec had it): tokens (per position: token_id, active, latents and values,
        largest first) and top_latents (latent, max_value, position, positions). token_ids come
        from the model's tokenizer, e.g. tokenizer.encode(text). A crosscoder's dataset runs the
        prompt through every source's model (for model diffing, both models) side by side."""
        request = datasets_pb2.EncodePromptRequest(
            dataset_id=dataset_id, token_ids=[int(t) for t in token_ids],
            latents_per_token=latents_per_token, top_latents=top_latents)
        return self.datasets.EncodePrompt(request, metadata=self.metadata, timeout=self.timeout)

    def steer_prompt(self, dataset_id, token_ids, interventions, new_tokens=0, temperature=0.0,
                     seed=0, top_tokens=10, sweep=(), more=None, crosscoder_source=None):
        """The prompt through the dataset's model with some of its SAE's latents changed where
        the SAE's decoder writes, beside the model as it is (steering and ablation). Each
        intervention is (latent, mode, value) or (latent, mode, value, positions), mode "set"
        (0 ablates), "add" (steers along the decoder direction) or "scale"; positions count a
        prepended BOS as 0 (none: every position, generated ones too). The answer: prompt (BOS
        included), clean and steered runs (generated: new_tokens ids, greedy or sampled at
        `temperature` with `seed`, the same draws for both; next: the top_tokens most likely
        next tokens; token_losses and mean_loss over the prompt), kl_divergence of the next
        token, most_increased / most_decreased (token_id, clean_probability,
        steered_probability) and latent_values (each latent's value per prompt position).
        `sweep`: values of the first intervention, each one more steered run in the same batch
        (answer.sweep: value, run, kl_divergence), e.g. sweep=[0, 2, 4, 8, 16]. `more`: other
        datasets' latents (same model and weights, e.g. the job's other hooks) changed in the
        same steered runs, {dataset_id: [interventions as above]}: a circuit steered at once.
        `crosscoder_source`: for a crosscoder over several models (model diffing), the model to
        steer (0 for the first of the datasets it was trained on); the other models run beside
        it on the same tokens for the latents' values."""
        modes = {"set": datasets_pb2.LatentIntervention.SET,
                 "add": datasets_pb2.LatentIntervention.ADD,
                 "scale": datasets_pb2.LatentIntervention.SCALE}
        request = datasets_pb2.SteerPromptRequest(
            dataset_id=dataset_id, token_ids=[int(t) for t in token_ids], new_tokens=new_tokens,
            temperature=temperature, seed=seed, top_tokens=top_tokens,
            sweep=[float(v) for v in sweep])
        if crosscoder_source is not None:
            request.crosscoder_source = int(crosscoder_source)
        def add(to, items):
            for item in items:
                if isinstance(item, datasets_pb2.LatentIntervention):
                    to.append(item)
                    continue
                latent, mode, value = item[:3]
                if mode not in modes:
                    raise ValueError("intervention mode %r: one of set, add, scale" % (mode,))
                to.add(latent=int(latent), mode=modes[mode], value=float(value),
                       positions=[int(p) for p in (item[3] if len(item) > 3 else [])])
        add(request.interventions, interventions)
        for other, items in (more or {}).items():
            add(request.more_interventions.add(dataset_id=int(other)).interventions, items)
        return self.datasets.SteerPrompt(request, metadata=self.metadata, timeout=self.timeout)

    def attribute_prompt(self, dataset_id, token_ids, target_token_id=None,
                         contrast_token_id=None, top=20, target_latent=None, ablate=0,
                         crosscoder_source=None):
        """Which of the dataset's SAE latents, where in the prompt, drive the prediction after
        it (attribution patching through the SAE: one forward and backward pass): the metric
        log p(target) (default target: the model's most likely next token), or with a
        contrast the logit difference target - contrast; top_entries (latent, position,
        activation, attribution: its first-order contribution; removing it moves the metric by
        about minus this) and
        top_latents (summed over positions) by |attribution|; latent_attribution and
        error_attribution (the SAE's error term), in all and per position.
        target_latent=(dataset, latent, position): the metric is instead that latent's value at
        that prompt position (an SAE on a later hook of the same model): which latents upstream
        drive it, the edges of a sparse feature circuit. ablate=N (at most 64): the top N
        entries are each taken out of a run of their own and the metric measured, their
        ablated_change beside the first-order credit (which predicts minus it).
        `crosscoder_source`: for a crosscoder over several models (model diffing), the model
        whose prediction (or, with target_latent, whose later latent) is explained (0 for the
        first of the datasets it was trained on); the other models run beside it for the
        latents' values."""
        request = datasets_pb2.AttributePromptRequest(
            dataset_id=dataset_id, token_ids=[int(t) for t in token_ids], top=top,
            ablate=ablate)
        if crosscoder_source is not None:
            request.crosscoder_source = int(crosscoder_source)
        _set_metric(request, target_token_id, contrast_token_id, target_latent)
        return self.datasets.AttributePrompt(request, metadata=self.metadata,
                                             timeout=self.timeout)

    def attribution_graph(self, dataset_ids, token_ids, target_token_id=None,
                          contrast_token_id=None, target_latent=None, per_hook=4,
                          output_dataset_id=0, progress=None, min_importance=0.0,
                          node_threshold=0.0, ablate=False, crosscoder_source=None):
        """An attribution graph of the prompt over an SAE suite (dataset_ids: its datasets, any
        order; e.g. the outputs of one EXTRACT job): the latents, at their positions, that
        carry the metric hook by hook (AttributionGraph: nodes with their importance, the
        share of the output through them; edges with each parent's credit for its child; each
        hook's SAE error node). The metric as attribute_prompt's; output_dataset_id: the hook
        that explains it (later ones left out), 0 the latest; min_importance: keep no node
        carrying less of the output (pruning a deep suite's passes); node_threshold: each hook
        keeps the fewest nodes (at most per_hook) carrying that share of what its latents carry
        (e.g. 0.8; 0: per_hook alone). Each of the answer's hooks says where what reaches it
        goes: kept_nodes, kept_importance, error_importance, dropped_importance. ablate=True:
        each child's per_hook strongest parents are taken out one run each (attribute_prompt's
        ablation check) and the edges from them carry ablated_change, the child's (or the
        metric's) measured change; circuit_ablated_change is the metric's change with all
        circuit_latents of the graph's latents taken out of one run together. progress:
        called with each AttributionGraphProgress (hooks_done, hooks, passes, hook_name) as the
        daemon streams it. crosscoder_source: with a model-diffing crosscoder among the
        datasets, the model the graph runs (attribute_prompt's); the others are that model's."""
        request = datasets_pb2.AttributionGraphRequest(
            dataset_ids=[int(d) for d in dataset_ids], token_ids=[int(t) for t in token_ids],
            per_hook=per_hook, output_dataset_id=output_dataset_id,
            min_importance=min_importance, node_threshold=node_threshold, ablate=ablate)
        if crosscoder_source is not None:
            request.crosscoder_source = int(crosscoder_source)
        _set_metric(request, target_token_id, contrast_token_id, target_latent)
        graph = None
        for event in self.datasets.AttributionGraph(request, metadata=self.metadata,
                                                    timeout=self.timeout):
            if event.HasField("graph"):
                graph = event.graph
            elif progress is not None:
                progress(event.progress)
        return graph

    def show_attribution_graph(self, dataset_ids, token_ids, decode=None, node_tokens=3,
                               **graph_args):
        """attribution_graph's answer as an AttributionGraphView, which a notebook draws as
        `latentctl graph --html` does: a column per hook with what its nodes cover, edges blue
        (for) or red (against), each latent labelled with the node_tokens tokens it fires on
        most over its dataset (0: no labels)."""
        answer = self.attribution_graph(dataset_ids, token_ids, **graph_args)
        return AttributionGraphView(answer, decode,
                                    self.graph_labels(answer, node_tokens, decode))

    def graph_labels(self, graph, tokens=3, decode=None):
        """A label per latent node of an attribution graph: {(dataset_id, latent): text}, the
        `tokens` tokens it fires on most over its dataset with their share of its firings (what
        `latentctl graph` prints under each node)."""
        labels = {}
        for node in list(graph.nodes)[1:]:
            if tokens <= 0 or node.latent < 0 or not 0 <= node.hook < len(graph.hooks):
                continue
            key = (graph.hooks[node.hook].dataset_id, node.latent)
            if key in labels:
                continue
            counts = self.get_latent(key[0], key[1], top_n=1, top_tokens=tokens).top_tokens
            ids = [t.token_id for t in counts]
            words = ["%r" % w for w in decode(ids)] if decode else [str(i) for i in ids]
            labels[key] = ", ".join("%s %.0f%%" % (w, 100 * t.fraction)
                                    for w, t in zip(words, counts))
        return labels

    def compare_saes(self, dataset_id, other_dataset_id, latents=None, sample=0, bins=20):
        """How far two datasets' SAEs learned the same directions: for each compared latent of
        the first (all, the given latents, or `sample` of them evenly spread) the other SAE's
        latent with the nearest decoder direction. A dict: latents, best_latents (int32 numpy),
        best_cosines (float32), mean_best_cosine, histogram (equal bins over [-1, 1])."""
        import numpy as np

        request = datasets_pb2.CompareSaesRequest(
            dataset_id=dataset_id, other_dataset_id=other_dataset_id, latents=latents or [],
            sample=sample, bins=bins)
        answer = self.datasets.CompareSaes(request, metadata=self.metadata, timeout=self.timeout)
        return {"latents": np.frombuffer(answer.latents, "<i4"),
                "best_latents": np.frombuffer(answer.best_latents, "<i4"),
                "best_cosines": np.frombuffer(answer.best_cosines, "<f4"),
                "mean_best_cosine": answer.mean_best_cosine,
                "histogram": np.array(answer.histogram, np.int64)}

    def latent_scaling(self, dataset_id, latents=None, source=None, baseline=None,
                       max_rows=0, limit=0, min_share=None):
        """Latent scaling (Minder et al. 2025) of a model-diffing crosscoder's latents: for each
        latent (the given ones, or the source model's own that fire: share of the decoder norm
        at least `min_share`, default 0.9; at most `limit`, largest share first) the
        least-squares scale of its source-model decoder direction in each
        model's reconstruction error (with the latent's own part put back) and in the other
        latents' reconstruction, over up to `max_rows` of its firing rows, and the ratios
        baseline / source: error_ratio and reconstruction_ratio both near 0 mark a latent truly
        the source model's own; near 1, the baseline model carries it too (an artifact of the
        crosscoder's sparsity). `source` defaults to the last model, `baseline` to the first.
        A dict of numpy columns (latent, share, rows, firing_count, error_ratio,
        reconstruction_ratio, beta_error_source, beta_error_baseline,
        beta_reconstruction_source, beta_reconstruction_baseline; pandas.DataFrame takes it
        after dropping the scalars) and source, baseline, rows_read."""
        import numpy as np

        request = datasets_pb2.LatentScalingRequest(
            dataset_id=dataset_id, latents=[int(j) for j in (latents if latents is not None
                                                              else [])],
            max_rows=max_rows, limit=limit)
        if source is not None:
            request.source = int(source)
        if baseline is not None:
            request.baseline = int(baseline)
        if min_share is not None:
            request.min_share = float(min_share)
        answer = self.datasets.LatentScaling(request, metadata=self.metadata,
                                             timeout=self.timeout)
        out = {"source": answer.source, "baseline": answer.baseline,
               "rows_read": answer.rows_read}
        for field, dtype in (("latent", np.int64), ("rows", np.int64),
                             ("firing_count", np.int64), ("share", np.float64),
                             ("error_ratio", np.float64), ("reconstruction_ratio", np.float64),
                             ("beta_error_source", np.float64),
                             ("beta_error_baseline", np.float64),
                             ("beta_reconstruction_source", np.float64),
                             ("beta_reconstruction_baseline", np.float64)):
            out[field] = np.array([getattr(l, field) for l in answer.latents], dtype)
        return out

    def show_latent_scaling(self, dataset_id, latents=None, **scaling_args):
        """latent_scaling's answer as a LatentScalingView, which a notebook shows as each
        latent at its two ratios (hover a point for the latent) above the table."""
        return LatentScalingView(self.latent_scaling(dataset_id, latents, **scaling_args))

    def show_prompt(self, dataset_id, token_ids, decode=None, top_latents=10):
        """encode_prompt's answer as a PromptView, which a notebook shows as the prompt once per
        top latent, each time with the tokens shaded by that latent's value on them. decode maps
        a list of token ids to their strings (e.g. tokenizer.convert_ids_to_tokens)."""
        answer = self.encode_prompt(dataset_id, token_ids, latents_per_token=1000,
                                    top_latents=top_latents)
        return PromptView(answer, decode)

    def show_steering(self, dataset_id, token_ids, interventions, decode=None, **steer_args):
        """steer_prompt's answer as a SteeringView, which a notebook shows as the prompt
        continued clean and steered (and each sweep value's run) side by side, with the next
        token's top predictions of both and the KL. decode maps a list of token ids to their
        strings; steer_args go to steer_prompt (new_tokens defaults to 20 here)."""
        steer_args.setdefault("new_tokens", 20)
        return SteeringView(self.steer_prompt(dataset_id, token_ids, interventions, **steer_args),
                            decode)

    def show_attribution(self, dataset_id, token_ids, decode=None, top=10, **attribute_args):
        """attribute_prompt's answer as an AttributionView, which a notebook shows as the prompt
        shaded by each position's attribution (blue for the metric, red against), then once per
        top latent shaded by its entries: the picture of `latentctl attribute --html`."""
        answer = self.attribute_prompt(dataset_id, token_ids, top=1000, **attribute_args)
        return AttributionView(answer, decode, top)

    def show_latent(self, dataset_id, latent, decode=None, weights=False, **get_latent_args):
        """GetLatent's answer as a LatentView, which a notebook shows as the latent's examples
        with each token shaded by the latent's value on it. decode maps a list of token ids to
        their strings (e.g. tokenizer.convert_ids_to_tokens); without it the ids are shown.
        weights=True: also its direct logits and decoder neighbours (latent_weights).
        get_latent_args go to get_latent (top_n, intervals, distinct_sequences, silent_samples,
        ...)."""
        answer = self.get_latent(dataset_id, latent, **get_latent_args)
        found = self.latent_weights(dataset_id, latent, top_n=5) if weights else None
        return LatentView(answer, decode, found)

    def latent_table(self, dataset_id, page_size=65536):
        """Every latent's firing_count, density, mean and max as numpy arrays indexed by latent
        (a dict, with "rows" and "dead_latents"), from ListLatents pages of page_size latents:
        what a notebook plots or filters without paging by hand."""
        import numpy as np

        page = page_size
        first = self.list_latents(dataset_id, limit=page)
        pages = [first]
        while len(pages) * page < first.d_sae:
            pages.append(self.list_latents(dataset_id, limit=page, offset=len(pages) * page))
        latents = [l for p in pages for l in p.latents]
        table = {"rows": first.rows, "dead_latents": first.dead_latents}
        table["firing_count"] = np.fromiter((l.firing_count for l in latents), np.int64,
                                            len(latents))
        for name in ("density", "mean", "max"):
            table[name] = np.fromiter((getattr(l, name) for l in latents), np.float64,
                                      len(latents))
        return table


class LatentView:
    """A GetLatent answer that Jupyter renders (_repr_html_): statistics, then the top examples
    and interval samples, each token's background the latent's value on it over the latent's
    max (context_values), the example's own token outlined, row/id/value in each tooltip. The
    same picture as `latentctl latent --html`, inline. With weights (a GetLatentWeights answer)
    also the tokens its decoder direction raises and lowers most and its nearest latents."""

    def __init__(self, answer, decode=None, weights=None):
        self.answer = answer
        self.decode = decode
        self.weights = weights

    def _logits(self, logits):
        import html

        ids = [l.token_id for l in logits]
        words = self.decode(ids) if self.decode else [str(i) for i in ids]
        return ", ".join("<code>%s</code> %+.3g" % (html.escape(str(w)), l.logit)
                         for w, l in zip(words, logits))

    def _example(self, example, peak):
        import html

        ids = list(example.context_token_ids)
        words = self.decode(ids) if self.decode else [" %d" % i for i in ids]
        values = list(example.context_values)
        if len(values) != len(ids):  # a daemon that predates them: the row's own value only
            values = [example.value if example.context_start_row + i == example.row else 0.0
                      for i in range(len(ids))]
        spans = []
        for i, (token, word, value) in enumerate(zip(ids, words, values)):
            row = example.context_start_row + i
            style = "background:rgba(255,102,0,%.3f)" % (min(max(value / peak, 0.0), 1.0)
                                                          if peak > 0 else 0.0)
            if row == example.row:
                style += ";outline:1.5px solid #c03000"
            spans.append('<span style="%s" title="row %d · token %d · value %.4g">%s</span>' % (
                style, row, token, value, html.escape(str(word))))
        return ('<div style="font-family:monospace;white-space:pre;margin:2px 0">'
                '<span style="display:inline-block;width:6em;text-align:right">%.4g</span>  %s'
                '</div>' % (example.value, "".join(spans)))

    def _repr_html_(self):
        s = self.answer.statistics
        parts = ["<div><b>latent %d</b>: fires %d times (density %.5f), mean %.4g, max %.4g</div>"
                 % (s.latent, s.firing_count, s.density, s.mean, s.max)]
        if self.answer.top_tokens:  # get_latent(..., top_tokens=N)
            import html

            ids = [t.token_id for t in self.answer.top_tokens]
            words = self.decode(ids) if self.decode else [str(i) for i in ids]
            parts.append("<div>fires most on: %s</div>" % ", ".join(
                "<code>%s</code> %.0f%%" % (html.escape(str(w)), 100 * t.fraction)
                for w, t in zip(words, self.answer.top_tokens)))
        w = self.weights
        if w is not None and w.positive_logits:
            parts.append("<div>raises: %s</div><div>lowers: %s</div>" % (
                self._logits(w.positive_logits), self._logits(w.negative_logits)))
        if w is not None and w.neighbors:
            parts.append("<div>nearest decoder directions: %s</div>" % ", ".join(
                "%d (%.3f)" % (n.latent, n.cosine) for n in w.neighbors))
        parts += [self._example(e, s.max) for e in self.answer.top]
        for interval in self.answer.intervals:
            parts.append("<div><i>[%.4g, %.4g]: %d firings</i></div>" % (
                interval.low, interval.high, interval.count))
            parts += [self._example(e, s.max) for e in interval.samples]
        if self.answer.silent:  # get_latent(..., silent_samples=N)
            parts.append("<div><i>silent windows: it fires on no token</i></div>")
            parts += [self._example(e, s.max) for e in self.answer.silent]
        return "\n".join(parts)


class PromptView:
    """An EncodePrompt answer (asked with latents_per_token large enough to hold every active
    latent) that Jupyter renders: per top latent its number and largest value, then the prompt's
    tokens shaded by that latent's value on each, its largest outlined; a token's tooltip lists
    its own largest latents. The same picture as `latentctl prompt --html`."""

    def __init__(self, answer, decode=None):
        self.answer = answer
        self.decode = decode

    def _repr_html_(self):
        import html

        ids = [t.token_id for t in self.answer.tokens]
        words = self.decode(ids) if self.decode else [" %d" % i for i in ids]
        parts = ["<div><b>%d tokens</b>%s</div>" % (
            len(ids), " (BOS prepended, as the dataset's spec did)"
            if self.answer.bos_prepended else "")]
        # Per token, once: its latents' values and its own top five for the tooltip.
        values = [dict(zip(t.latents, t.values)) for t in self.answer.tokens]
        tops = [", ".join("%d: %.3g" % (j, v) for j, v in list(zip(t.latents, t.values))[:5])
                for t in self.answer.tokens]
        for latent in self.answer.top_latents:
            spans = []
            for r, (token, word) in enumerate(zip(self.answer.tokens, words)):
                value = values[r].get(latent.latent, 0.0)
                alpha = min(max(value / latent.max_value, 0.0), 1.0) if latent.max_value > 0 else 0
                style = "background:rgba(255,102,0,%.3f)" % alpha
                if r == latent.position:
                    style += ";outline:1.5px solid #c03000"
                spans.append('<span style="%s" title="position %d · token %d · value %.4g · %s">'
                             "%s</span>" % (style, r, token.token_id, value, tops[r],
                                            html.escape(str(word))))
            parts.append('<div style="font-family:monospace;white-space:pre;margin:2px 0">'
                         '<span style="display:inline-block;width:10em">latent %d (%.4g)</span>'
                         "  %s</div>" % (latent.latent, latent.max_value, "".join(spans)))
        return "\n".join(parts)


def _set_metric(request, target_token_id, contrast_token_id, target_latent):
    """An attribution request's metric: a target token (and a contrast), or a latent as
    (dataset, latent, position)."""
    if target_token_id is not None:
        request.target_token_id = int(target_token_id)
    if contrast_token_id is not None:
        request.contrast_token_id = int(contrast_token_id)
    if target_latent is not None:
        dataset, latent, position = target_latent
        request.target_latent.dataset_id = int(dataset)
        request.target_latent.latent = int(latent)
        request.target_latent.position = int(position)


def _words(decode, ids):
    """Token ids as the strings a view shows: decode's, or the ids."""
    return decode(list(ids)) if decode else [" %d" % i for i in ids]


def _signed_spans(words, ids, values, scale, titles):
    """Tokens shaded by signed values over scale: blue for, red against."""
    import html

    spans = []
    for word, token, value, title in zip(words, ids, values, titles):
        alpha = min(abs(value) / scale, 1.0) if scale > 0 else 0.0
        rgb = "0,102,255" if value >= 0 else "255,51,0"
        spans.append('<span style="background:rgba(%s,%.3f)" title="token %d · %s">%s</span>' % (
            rgb, alpha, token, title, html.escape(str(word))))
    return "".join(spans)


class SteeringView:
    """A SteerPrompt answer that Jupyter renders: the prompt shaded by how much better (blue) or
    worse (red) the steered run predicts each token, each run's continuation (clean, steered,
    then each sweep value's) with its KL from the clean run and its top next token, and for a
    sweep the KL plotted against the value (as `latentctl steer --html` draws them)."""

    def __init__(self, answer, decode=None):
        self.answer = answer
        self.decode = decode

    def _text(self, ids):
        import html

        return html.escape("".join(str(w) for w in _words(self.decode, ids)))

    def _repr_html_(self):
        a = self.answer
        rows = [("clean", 0.0, a.clean), ("steered", a.kl_divergence, a.steered)]
        rows += [("sweep %g" % s.value, s.kl_divergence, s.run) for s in a.sweep]
        ids = list(a.prompt)
        # Token s + 1 is what position s predicts: the clean loss minus the steered one.
        change = [0.0] + [c - t for c, t in zip(a.clean.token_losses, a.steered.token_losses)]
        change += [0.0] * (len(ids) - len(change))
        parts = ['<div style="font-family:monospace;white-space:pre">%s</div>' % _signed_spans(
                     _words(self.decode, ids), ids, change, max(map(abs, change), default=0),
                     ["loss %+.4f steered" % -d for d in change]),
                 '<table style="font-family:monospace"><tr><th>run</th><th>KL</th>'
                 "<th>next</th><th>continuation</th></tr>"]
        for name, kl, run in rows:
            top = run.next[0] if run.next else None
            parts.append("<tr><td>%s</td><td>%.4g</td><td>%s</td><td>%s</td></tr>" % (
                name, kl, "%s %.3f" % (self._text([top.token_id]), top.probability) if top else "",
                self._text(run.generated)))
        parts.append("</table>")
        points = sorted((s.value, s.kl_divergence) for s in a.sweep)
        if points:
            lo, hi = points[0][0], points[-1][0]
            top = max(kl for _, kl in points) or 1.0
            span = (hi - lo) or 1.0
            xy = ["%.1f,%.1f" % (48 + 424 * (v - lo) / span, 8 + 132 * (1 - kl / top))
                  for v, kl in points]
            parts.append(
                '<svg width="480" height="160" style="font-size:11px">'
                '<polyline points="%s" fill="none" stroke="#0066ff"/>%s'
                '<text x="48" y="156">%g</text><text x="472" y="156" text-anchor="end">%g</text>'
                '<text x="44" y="14" text-anchor="end">%.3g</text>'
                '<text x="260" y="156" text-anchor="middle">KL (nats) against the value</text>'
                "</svg>" % (" ".join(xy), "".join(
                    '<circle cx="%s" cy="%s" r="3" fill="#0066ff"><title>value %g: KL %.4g'
                    "</title></circle>" % (*p.split(","), v, kl)
                    for p, (v, kl) in zip(xy, points)), lo, hi, top))
        return "\n".join(parts)


class AttributionView:
    """An AttributePrompt answer (asked with a large top) that Jupyter renders: the metric and
    totals, the prompt shaded by each position's attribution (latents and error term; blue for
    the metric, red against), then a line per top latent shaded by its entries; with an
    ablation check (ablate=N), each checked entry's measured change against the change its
    credit predicts, plotted about the diagonal."""

    def __init__(self, answer, decode=None, top=10):
        self.answer = answer
        self.decode = decode
        self.top = top

    def _repr_html_(self):
        a = self.answer
        ids = list(a.prompt)
        words = _words(self.decode, ids)
        totals = [l + e for l, e in zip(a.latent_attribution_by_position,
                                        a.error_attribution_by_position)]
        line = '<div style="font-family:monospace;white-space:pre;margin:2px 0">%s  %s</div>'
        if a.HasField("target_latent"):
            t = a.target_latent
            of = "latent %d of dataset %d at position %d" % (t.latent, t.dataset_id, t.position)
        else:
            of = "token %d%s" % (a.target_token_id, " against %d" % a.contrast_token_id
                                 if a.HasField("contrast_token_id") else "")
        parts = ["<div>metric %.4f for %s: latents %+.4f, the SAE's error term %+.4f</div>"
                 % (a.metric, of, a.latent_attribution, a.error_attribution),
                 line % ('<span style="display:inline-block;width:10em">by position</span>',
                         _signed_spans(words, ids, totals, max(map(abs, totals), default=0),
                                       ["position %d · %+.4f" % (p, t)
                                        for p, t in enumerate(totals)]))]
        entries = {(e.latent, e.position): e for e in a.top_entries}
        scale = max((abs(e.attribution) for e in a.top_entries), default=0)
        for latent in list(a.top_latents)[:self.top]:
            values = [entries[(latent.latent, p)].attribution
                      if (latent.latent, p) in entries else 0.0 for p in range(len(ids))]
            parts.append(line % (
                '<span style="display:inline-block;width:10em">latent %d %+.3g</span>'
                % (latent.latent, latent.attribution),
                _signed_spans(words, ids, values, scale,
                              ["position %d · %+.4g" % (p, v) for p, v in enumerate(values)])))
        parts.append(_ablation_plot(a))
        return "\n".join(parts)


class LatentScalingView:
    """latent_scaling's answer that Jupyter renders: an SVG scatter of each latent at (error
    ratio, reconstruction ratio) over [-0.5, 1.5], held at the edge outside it (the latents truly
    the source model's own near the origin, as `latentctl scaling --plot` draws them), then a
    row per latent."""

    def __init__(self, answer):
        self.answer = answer

    def _repr_html_(self):
        import math

        a = self.answer
        side, margin, lo, hi = 320, 36, -0.5, 1.5

        def at(v, flip):
            f = (min(max(v, lo), hi) - lo) / (hi - lo)
            return margin + (side - margin - 8) * f if not flip else 8 + (
                side - margin - 8) * (1 - f)
        parts = ["<div>latent scaling of source %d's latents against source %d (%d rows read): "
                 "near 0 on both axes, the source's own; near 1, source %d carries it too</div>"
                 % (a["source"], a["baseline"], a["rows_read"], a["baseline"]),
                 '<svg width="%d" height="%d" style="font-size:11px">' % (side, side)]
        for v in (0.0, 1.0):
            parts.append('<line x1="%.1f" y1="8" x2="%.1f" y2="%d" stroke="#bbb"/>'
                         '<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#bbb"/>'
                         '<text x="%.1f" y="%d" text-anchor="middle">%g</text>'
                         '<text x="%d" y="%.1f" text-anchor="end">%g</text>'
                         % (at(v, False), at(v, False), side - margin, margin, at(v, True),
                            side - 8, at(v, True), at(v, False), side - margin + 13, v,
                            margin - 4, at(v, True) + 4, v))
        for i, latent in enumerate(a["latent"]):
            x, y = a["error_ratio"][i], a["reconstruction_ratio"][i]
            if not (math.isfinite(x) and math.isfinite(y)):
                continue
            inside = lo <= x <= hi and lo <= y <= hi
            parts.append('<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>latent %d: '
                         'error ratio %.3f, reconstruction ratio %.3f</title></circle>'
                         % (at(x, False), at(y, True), "#1f77b4" if inside else "#ff7f0e",
                            latent, x, y))
        parts.append('<text x="%d" y="%d" text-anchor="middle">error ratio</text>'
                     '<text x="4" y="%d">reconstruction ratio</text></svg>'
                     % ((margin + side) // 2, side - 6, 4 + 8))
        parts.append('<table style="font-family:monospace"><tr><th>latent</th><th>share</th>'
                     "<th>rows</th><th>error ratio</th><th>reconstruction ratio</th></tr>")
        for i, latent in enumerate(a["latent"]):
            parts.append("<tr><td>%d</td><td>%.3f</td><td>%d</td><td>%.3f</td><td>%.3f</td></tr>"
                         % (latent, a["share"][i], a["rows"][i], a["error_ratio"][i],
                            a["reconstruction_ratio"][i]))
        parts.append("</table>")
        return "\n".join(parts)


class SparseProbeView:
    """sparse_probe's answer that Jupyter renders: an SVG chart of test accuracy, balanced
    accuracy and F1, and train accuracy against k (evenly spaced, in the order asked; the axis
    from 0.5, chance for balanced classes, to 1), then a row per k with its metrics and
    latents."""

    SERIES = (("test_accuracy", "#1f77b4", "test accuracy"),
              ("test_balanced_accuracy", "#2ca02c", "test balanced accuracy"),
              ("test_f1", "#ff7f0e", "test F1"), ("train_accuracy", "#999999", "train accuracy"))

    def __init__(self, answer):
        self.answer = answer

    def _repr_html_(self):
        a = self.answer
        # The plot spans [margin, right] across; the legend stands to its right.
        width, right, height, margin = 510, 340, 220, 40
        ks = [int(k) for k in a["k"]]

        def x(i):
            return margin + (right - margin) * (i / max(1, len(ks) - 1))

        def y(v):
            return 8 + (height - margin - 8) * (1 - (min(max(v, 0.5), 1.0) - 0.5) / 0.5)
        held = a["examples"]
        parts = ["<div>k-sparse probe: %d + %d examples to train on, %d + %d held out "
                 "(positive + negative)</div>"
                 % (held["train_positive"], held["train_negative"], held["test_positive"],
                    held["test_negative"]),
                 '<svg width="%d" height="%d" style="font-size:11px">' % (width, height)]
        for v in (0.5, 0.75, 1.0):
            parts.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>'
                         '<text x="%d" y="%.1f" text-anchor="end">%g</text>'
                         % (margin, y(v), right, y(v), margin - 4, y(v) + 4, v))
        for i, k in enumerate(ks):
            parts.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>'
                         % (x(i), height - margin + 14, k))
        for row, (field, color, label) in enumerate(self.SERIES):
            points = " ".join("%.1f,%.1f" % (x(i), y(v)) for i, v in enumerate(a[field]))
            parts.append('<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>'
                         % (points, color))
            for i, v in enumerate(a[field]):
                parts.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>k = %d: %s '
                             '%.4f</title></circle>' % (x(i), y(v), color, ks[i], label, v))
            parts.append('<text x="%d" y="%d" fill="%s">%s</text>'
                         % (right + 16, 16 + 14 * row, color, label))
        parts.append('<text x="%d" y="%d" text-anchor="middle">k</text></svg>'
                     % ((margin + right) // 2, height - 8))
        parts.append('<table style="font-family:monospace"><tr><th>k</th><th>train acc</th>'
                     "<th>test acc</th><th>balanced acc</th><th>precision</th><th>recall</th>"
                     "<th>F1</th><th>latents (weight)</th></tr>")
        for i, k in enumerate(ks):
            chosen = ", ".join("%d (%+.3g)" % (l, w)
                               for l, w in zip(a["latents"][:k], a["weights"][i]))
            parts.append("<tr><td>%d</td><td>%.4f</td><td>%.4f</td><td>%.4f</td><td>%.4f</td>"
                         "<td>%.4f</td><td>%.4f</td><td>%s</td></tr>"
                         % (k, a["train_accuracy"][i], a["test_accuracy"][i],
                            a["test_balanced_accuracy"][i], a["test_precision"][i],
                            a["test_recall"][i], a["test_f1"][i], chosen))
        parts.append("</table>")
        return "\n".join(parts)


def _ablation_plot(answer):
    """The checked entries of an AttributePrompt answer as an SVG scatter (across: minus the
    credit, the change it predicts; up: the change measured; the diagonal where they agree),
    or "" without a check."""
    checked = [e for e in answer.top_entries if e.HasField("ablated_change")]
    if not checked:
        return ""
    most = max(max(abs(e.attribution), abs(e.ablated_change)) for e in checked) or 1.0
    side, margin = 300, 40

    def at(v):
        return margin + (side - margin - 8) * (v + most) / (2 * most)

    def up(v):
        return 8 + (side - margin - 8) * (most - v) / (2 * most)
    agree = sum((-e.attribution > 0) == (e.ablated_change > 0) for e in checked)
    ratios = sorted(e.ablated_change / -e.attribution for e in checked if e.attribution)
    median = "; measured / predicted, median %.3g" % ratios[len(ratios) // 2] if ratios else ""
    parts = ['<div>ablation check of the top %d entries: the measured change has the sign the '
             'credit predicts for %d of them%s</div>' % (len(checked), agree, median),
             '<svg width="%d" height="%d">' % (side, side),
             '<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#999" '
             'stroke-dasharray="4 3"/>' % (at(-most), up(-most), at(most), up(most))]
    for e in checked:
        parts.append('<circle cx="%.1f" cy="%.1f" r="3.5" fill="#ff6600"><title>latent %d at '
                     '%d: predicted %+.4g, measured %+.4g</title></circle>'
                     % (at(-e.attribution), up(e.ablated_change), e.latent, e.position,
                        -e.attribution, e.ablated_change))
    parts.append('<text x="%d" y="%d" text-anchor="middle">predicted (minus the credit)</text>'
                 '</svg>' % ((margin + side) // 2, side - 6))
    return "\n".join(parts)


class AttributionGraphView:
    """An AttributionGraph answer that Jupyter draws as SVG: a column per hook (earliest left,
    under its name where what reaches it goes) and the output on the right; each node a latent
    at a position (shaded by importance over the largest, with its label if `labels` has one),
    each edge blue (for) or red (against), as wide as its share of the strongest edge into the
    same node; the notes under it."""

    def __init__(self, answer, decode=None, labels=None):
        self.answer = answer
        self.decode = decode
        self.labels = labels or {}  # {(dataset_id, latent): text}, e.g. Client.graph_labels

    def _label(self, node):
        g = self.answer
        if node.latent < 0 or not 0 <= node.hook < len(g.hooks):
            return ""
        return self.labels.get((g.hooks[node.hook].dataset_id, node.latent), "")

    def _repr_html_(self):
        import html

        g = self.answer
        words = _words(self.decode, list(g.output.prompt))
        columns = len(g.hooks) + 1
        labelled = any(self._label(node) for node in g.nodes)
        box = 52 if labelled else 38  # a third line in every box for the labels
        rows = [[] for _ in range(columns)]
        for n, node in enumerate(g.nodes):
            rows[min(max(node.hook, 0), columns - 1)].append(n)
        at = {}
        for c, column in enumerate(rows):
            column.sort(key=lambda n: (g.nodes[n].latent < 0, g.nodes[n].position,
                                       g.nodes[n].latent))
            for r, n in enumerate(column):
                at[n] = (10 + 230 * c, 52 + (box + 12) * r)
        height = 52 + (box + 12) * max(1, max(len(column) for column in rows))
        parts = ['<div>attribution graph: metric %.4f over %d hooks</div>'
                 % (g.output.metric, len(g.hooks)),
                 '<svg width="%d" height="%d" style="font-size:12px">' % (10 + 230 * columns,
                                                                          height)]
        names = [h.hook_name for h in g.hooks] + ["output"]
        for c, name in enumerate(names):
            parts.append('<text x="%d" y="20" font-weight="bold">%s</text>'
                         % (10 + 230 * c, html.escape(name)))
        for c, hook in enumerate(g.hooks):
            reaching = hook.kept_importance + hook.error_importance + hook.dropped_importance
            if reaching > 0:
                parts.append('<text x="%d" y="36" fill="#555">kept %.0f%% &#183; error %.0f%% '
                             '&#183; not kept %.0f%%</text>'
                             % (10 + 230 * c, 100 * hook.kept_importance / reaching,
                                100 * hook.error_importance / reaching,
                                100 * hook.dropped_importance / reaching))
        strongest = {}
        for e in g.edges:
            strongest[e.to_node] = max(strongest.get(e.to_node, 0.0), abs(e.attribution))
        for e in g.edges:
            (x1, y1), (x2, y2) = at[e.from_node], at[e.to_node]
            share = abs(e.attribution) / strongest[e.to_node] if strongest[e.to_node] else 0.0
            parts.append('<path d="M%d %d C%d %d %d %d %d %d" fill="none" stroke="%s" '
                         'stroke-width="%.2f" stroke-opacity="0.6"><title>%+.4g%s</title></path>'
                         % (x1 + 170, y1 + box // 2, (x1 + 170 + x2) // 2, y1 + box // 2,
                            (x1 + 170 + x2) // 2, y2 + box // 2, x2, y2 + box // 2,
                            "#0066ff" if e.attribution >= 0 else "#ff3300", 0.5 + 5 * share,
                            e.attribution,
                            " · taken out, it moves by %+.4g" % e.ablated_change
                            if e.HasField("ablated_change") else ""))
        most = max((node.importance for node in list(g.nodes)[1:]), default=0)
        for n, node in enumerate(g.nodes):
            x, y = at[n]
            if n == 0:
                first, second = "output", "%.4g" % g.output.metric
            elif node.latent < 0:
                first, second = "SAE error", "all positions"
            else:
                word = words[node.position] if 0 <= node.position < len(words) else ""
                first = "#%d @%d" % (node.latent, node.position)
                second = "%s = %.3g" % (word, node.activation)
            alpha = 0.8 if n == 0 or most <= 0 else 0.8 * node.importance / most
            label = self._label(node) if n > 0 else ""
            shown = label if len(label) <= 26 else label[:25] + "\u2026"
            notes = " · fires most on " + label if label else ""
            parts.append('<g><title>importance %.3f%s</title><rect x="%d" y="%d" width="170" '
                         'height="%d" rx="4" fill="rgba(255,102,0,%.3f)" stroke="#999"/>'
                         '<text x="%d" y="%d">%s</text><text x="%d" y="%d" '
                         'font-family="monospace">%s</text>%s</g>'
                         % (node.importance, html.escape(notes), x, y,
                            box, alpha, x + 6, y + 15, html.escape(first), x + 6, y + 31,
                            html.escape(str(second)),
                            '<text x="%d" y="%d" fill="#444">%s</text>'
                            % (x + 6, y + 46, html.escape(shown)) if shown else ""))
        parts.append("</svg>")
        checked = [(-e.attribution, e.ablated_change) for e in g.edges
                   if e.HasField("ablated_change")]
        if checked:
            ratios = sorted(y / x for x, y in checked if x)
            parts.append("<div>ablation check of %d edges: the measured change has the sign the "
                         "credit predicts for %d of them%s</div>" % (
                             len(checked), sum((x > 0) == (y > 0) for x, y in checked),
                             "; measured / predicted, median %.3g" % ratios[len(ratios) // 2]
                             if ratios else ""))
        if g.HasField("circuit_ablated_change"):
            parts.append("<div><b>the graph's %d latents taken out together move the metric by "
                         "%+.4g (%.4f -> %.4f)</b></div>" % (
                             g.circuit_latents, g.circuit_ablated_change, g.output.metric,
                             g.output.metric + g.circuit_ablated_change))
        parts.extend("<div>note: %s</div>" % html.escape(note) for note in g.notes)
        return "\n".join(parts)


def _concat(parts, dtype):
    import numpy as np

    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def _unpack(packed):
    """The arrays of a PackedCsr: int64 offsets, int32 indices, float32 values, int32 tokens."""
    import numpy as np

    offsets = np.frombuffer(packed.indptr, "<i8")
    indices = np.frombuffer(packed.indices, "<u2" if packed.index_bytes == 2 else "<i4")
    if packed.value_dtype == datasets_pb2.FLOAT32:
        values = np.frombuffer(packed.values, "<f4")
    elif packed.value_dtype == datasets_pb2.BFLOAT16:  # the high half of a float32
        values = (np.frombuffer(packed.values, "<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        values = np.frombuffer(packed.values, "<f2").astype(np.float32)
    return offsets, indices.astype(np.int32), values, np.frombuffer(packed.token_ids, "<i4")


class Crosscoder:
    """A crosscoder a TRAIN job saved (docs/TRAIN.md "Crosscoders"), read with numpy from its
    directory: the job result's artifact_path, on the machine that reads it.

        cc = Crosscoder(job.result.train.artifact_path)
        chat_only = numpy.where(cc.shares[1] >= 0.9)[0]     # the second model's own latents
        latents = cc.encode(numpy.stack([base_rows, chat_rows], axis=1))

    weights: model.safetensors' arrays by name (dictionary_learning's); config: config.json;
    sources: latentd.json's, each with hook_name, model_name, rows_from and training_scale;
    shares: [n, d_sae], each latent's share of its decoder norm in each source, at the training
    scale (what TrainResult.crosscoder counts)."""

    def __init__(self, path):
        import json
        import os
        import struct

        import numpy as np

        with open(os.path.join(path, "model.safetensors"), "rb") as f:
            data = f.read()
        (size,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + size])
        dtypes = {"F32": np.float32, "I32": np.int32, "I64": np.int64}
        self.weights = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            self.weights[name] = np.frombuffer(data[8 + size + begin:8 + size + end],
                                               dtypes[info["dtype"]]).reshape(info["shape"])
        with open(os.path.join(path, "config.json")) as f:
            self.config = json.load(f)
        with open(os.path.join(path, "latentd.json")) as f:
            self.sources = json.load(f)["sources"]
        scales = np.array([s["training_scale"] for s in self.sources])
        norms = np.linalg.norm(self.weights["decoder.weight"].astype(np.float64), axis=2)
        norms *= scales[:, None]
        self.shares = norms / np.maximum(norms.sum(0), 1e-30)

    def encode(self, x):
        """The latents [rows, d_sae] of x [rows, n, d_in] (each source's hook in its own units),
        as BatchTopKCrossCoder.encode with its threshold (CrossCoder.encode for a ReLU one)."""
        import numpy as np

        w = self.weights
        f = np.maximum(np.einsum("bld,ldf->bf", np.asarray(x, np.float64),
                                 w["encoder.weight"].astype(np.float64)) + w["encoder.bias"], 0)
        if "threshold" not in w:
            return f
        code_norm = np.linalg.norm(w["decoder.weight"].astype(np.float64), axis=2).sum(0)
        return np.where(f * code_norm > w["threshold"], f, 0.0)

    def decode(self, latents):
        """Each source's reconstruction [rows, n, d_in] of latents [rows, d_sae]."""
        import numpy as np

        w = self.weights
        return (np.einsum("bf,lfd->bld", np.asarray(latents, np.float64),
                          w["decoder.weight"].astype(np.float64)) + w["decoder.bias"])
