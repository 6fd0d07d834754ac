"""The Python client against the real service: uvicorn on 127.0.0.1 over Postgres, a real
Celery worker on Redis running the jobs (the real engine, ``llm: none`` and a small
uploaded public vocabulary, as ``tests/service/test_worker.py`` runs it).

One module-scoped run of the three users' flows (admin, hospital IT, client
organisation) feeds the tests: the job's corpus is downloaded in every format and
compared, its ledger and audit trail read, and the refusals checked as typed errors.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import pyarrow.parquet as pq
import pytest

from app.releases import export
from app.releases.export import escape_cell
from keyseed.client import (
    BudgetExceeded,
    Client,
    Conflict,
    Dataset,
    Forbidden,
    Job,
    JobFailed,
    JobPlan,
    JobTimeout,
    KeyseedError,
    NotFound,
    Release,
    ServerError,
    Unauthorized,
    UnsupportedMediaType,
    ValidationFailed,
)
from tests.client.conftest import Service
from tests.service import factories

pytestmark = [pytest.mark.slow]

PER_CLASS = 1250  # 2,500 sequences: three batches of the export, three Parquet row groups
JOB_TIMEOUT = 600.0  # seconds; two shared, busy cores


@dataclass(frozen=True)
class Flow:
    """What the three users' flows made and saw."""

    admin: Client
    owner: Client
    lab: Client
    other_lab: Client
    auditor: Client
    hospital_id: uuid.UUID
    lab_id: uuid.UUID
    dataset: Dataset
    plan: JobPlan
    submitted: Job
    timed_out: JobTimeout
    cancelled: JobFailed
    seen: list[Job]
    job: Job
    release: Release


def _spec(vocabulary: str, **overrides: Any) -> dict[str, Any]:
    return {
        "vocabulary": vocabulary,
        "llm": "none",
        "document_type": "clinical note",
        "epsilon_vocab": 0.5,
        "epsilon_kde": 0.5,
        "per_class": 2,
        "vocabulary_size": 8,
        "sequence_length": 3,
        "num_features": 64,
        **overrides,
    }


@pytest.fixture(scope="module")
def flow(service: Service, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flow]:
    root = tmp_path_factory.mktemp("flow")
    clients: list[Client] = []

    def connect(key: str) -> Client:
        clients.append(Client(service.url, key, timeout=60))
        return clients[-1]

    admin = connect(service.admin_key)
    # platform admin: organisations, their keys, a budget
    hospital = admin.create_organisation(
        "St Mary's Hospital", "owner", epsilon_budget=5, delta_budget=1e-6
    )
    lab = admin.create_organisation("Acme Research", "client")
    other_lab = admin.create_organisation("Vendor Inc", "client")
    owner = connect(admin.create_key("owner", hospital, name="hospital IT").key)
    lab_client = connect(admin.create_key("client", lab).key)
    other_lab_client = connect(admin.create_key("client", other_lab.id).key)
    auditor = connect(admin.create_key("auditor", name="privacy officer").key)

    # hospital IT: a public vocabulary, the corpus from a path, a dry run, the job
    phrases = root / "phrases.txt"
    phrases.write_text("\n".join(factories.PHRASES), encoding="utf-8")
    vocabulary = owner.upload_vocabulary(phrases, name="cardio-ortho", licence="CC0")
    notes = root / "notes.csv"
    notes.write_bytes(factories.csv_bytes(factories.ROWS))
    dataset = owner.upload_dataset(
        notes,
        name="notes-2026",
        text_columns="text",
        label_column="label",
        labels=factories.LABELS,
        epsilon_cap=2,
    )
    spec = _spec(vocabulary.id, per_class=PER_CLASS)
    plan = owner.dry_run(dataset, spec)
    submitted = owner.submit_job(dataset, spec)
    with pytest.raises(JobTimeout) as timed_out:  # the worker has not even loaded its models
        owner.wait(submitted, timeout=0.01)
    # the worker runs one job at a time: a second job waits in the queue behind it, and
    # is cancelled there at once (its reservation given back)
    behind = owner.submit_job(dataset.id, _spec(vocabulary.id))
    owner.cancel_job(behind)
    with pytest.raises(JobFailed) as cancelled:
        owner.wait(behind, timeout=60, interval=0.1)
    try:
        seen = list(owner.follow(submitted, interval=0.1, max_interval=0.2, timeout=JOB_TIMEOUT))
        job = owner.wait(submitted, timeout=10)
    except (JobFailed, JobTimeout):
        print(service.worker.text()[-5000:])  # the worker's log: types and ids, never text
        raise
    release = owner.release(job, [lab], name="cardio v1")
    try:
        yield Flow(
            admin=admin,
            owner=owner,
            lab=lab_client,
            other_lab=other_lab_client,
            auditor=auditor,
            hospital_id=hospital.id,
            lab_id=lab.id,
            dataset=dataset,
            plan=plan,
            submitted=submitted,
            timed_out=timed_out.value,
            cancelled=cancelled.value,
            seen=seen,
            job=job,
            release=release,
        )
    finally:
        for client in clients:
            client.close()


# ------------------------------------------------------------------ the flows


def test_the_platform_admin_manages_organisations_keys_and_budgets(
    service: Service, flow: Flow
) -> None:
    admin = flow.admin
    owners = {o.name: o for o in admin.list_organisations("owner")}
    assert owners["St Mary's Hospital"].epsilon_budget == 5
    assert {"Acme Research", "Vendor Inc"} <= {o.name for o in admin.list_organisations("client")}
    budget = admin.organisation_budget(flow.hospital_id)
    assert (budget.budget.epsilon, budget.allocated.epsilon, budget.datasets) == (5, 2, 1)
    raised = admin.set_organisation_budget(flow.hospital_id, 8, 1e-6, reason="board 2026-11")
    assert (raised.budget.epsilon, raised.remaining.epsilon) == (8, 6)
    keys = admin.list_keys(flow.hospital_id)
    assert [(k.role, k.name) for k in keys] == [("owner", "hospital IT")]

    # a key revoked stops working at once
    spare = admin.create_key("client", flow.lab_id)
    assert spare.prefix in spare.key
    with Client(service.url, spare.key) as doomed:
        assert doomed.list_releases()
        assert admin.revoke_key(spare).revoked_at is not None
        with pytest.raises(Unauthorized) as refused:
            doomed.list_releases()
    assert refused.value.status == 401

    # an admin changes a dataset's cap, with a reason
    changed = admin.set_dataset_cap(flow.dataset, 2.5, reason="IRB amendment 14")
    assert changed.budget.epsilon_cap == 2.5
    assert admin.set_dataset_cap(flow.dataset.id, 2, reason="back").budget.epsilon_cap == 2


def test_hospital_it_uploads_plans_submits_and_follows_a_job(service: Service, flow: Flow) -> None:
    with Client(service.url, "no key needed") as anyone:
        assert anyone.ready()
    dataset = flow.dataset
    assert (dataset.documents, dataset.labels, dataset.text_columns) == (
        4,
        list(factories.LABELS),
        ["text"],
    )
    assert dataset.budget.epsilon_cap == 2 and dataset.budget.spent == 0

    # the dry run planned what the job was then charged, and touched nothing
    plan = flow.plan
    assert plan.dry_run and plan.dataset_id == dataset.id and plan.epsilon == 1.0
    assert plan.by_mechanism == {"vocabulary": 0.5, "kde": 0.5}
    assert plan.events and plan.noise
    assert flow.submitted.state == "queued"
    assert flow.submitted.epsilon.by_mechanism == plan.by_mechanism
    assert flow.submitted.epsilon.budget_state == "reserved"

    # waiting gave up while the job was still on its way; cancelling the one behind it
    # ended it there, as JobFailed says
    assert flow.timed_out.job.id == flow.submitted.id
    assert flow.timed_out.job.state in ("queued", "running")
    assert "still" in str(flow.timed_out)
    assert flow.cancelled.job.state == "cancelled"
    assert flow.cancelled.job.epsilon.budget_state == "released"

    # following: the job as it changed, in order, ending when it finished
    states = [job.state for job in flow.seen]
    order = ["queued", "running", "succeeded"]
    assert states[-1] == "succeeded" and states == sorted(states, key=order.index)
    assert any(j.state == "running" and j.stage for j in flow.seen)  # its stages reported
    assert len(set(map(tuple, ((j.state, j.stage, j.progress) for j in flow.seen)))) == len(
        flow.seen
    )
    job = flow.job
    assert job.finished and job.progress == 1.0 and job.error is None
    assert job.counts.sequences == 2 * PER_CLASS
    assert job.epsilon.budget_state == "committed"
    assert [j.id for j in flow.owner.list_jobs(dataset)] == [
        j.id
        for j in sorted(flow.owner.list_jobs(dataset), key=lambda j: j.created_at, reverse=True)
    ]
    assert {j.id for j in flow.owner.list_jobs(dataset)} == {
        flow.submitted.id,
        flow.cancelled.job.id,
    }

    # the release, as its owner and its grantee see it
    release = flow.release
    assert (release.job_id, release.name, release.documents) == (job.id, "cardio v1", 2 * PER_CLASS)
    assert release.grantees == [flow.lab_id]
    assert release.manifest["privacy"]["epsilon_by_mechanism"] == plan.by_mechanism
    assert [r.id for r in flow.owner.list_releases()] == [release.id]
    assert flow.lab.get_release(release).manifest == release.manifest


def test_a_dataset_streams_up_from_a_file_object_of_unknown_size(flow: Flow) -> None:
    rows = [(f"note {i}: chest pain and heart failure", "cardio") for i in range(6000)]
    content = factories.csv_bytes(rows)
    assert len(content) > 200_000
    stream = _Unsized(content)
    dataset = flow.owner.upload_dataset(
        stream,  # type: ignore[arg-type]
        name="from a pipe",
        text_columns=["text"],
        label_column="label",
        labels=["cardio", "ortho"],
        epsilon_cap=0.5,
        format="csv",
    )
    assert dataset.documents == 6000 and dataset.upload_bytes == len(content)
    assert stream.reads > 3 and stream.largest_read <= 64 * 1024  # read a chunk at a time
    assert dataset.id in {d.id for d in flow.owner.list_datasets()}
    deleted = flow.owner.delete_dataset(dataset)
    assert deleted.deleted_at is not None


def test_the_client_organisation_downloads_each_format_streamed(flow: Flow, tmp_path: Path) -> None:
    lab = flow.lab
    assert [r.id for r in lab.list_releases()] == [flow.release.id]
    assert lab.list_releases()[0].grantees == [flow.lab_id]
    assert flow.other_lab.list_releases() == []

    paths = {fmt: tmp_path / f"corpus.{fmt}" for fmt in ("jsonl", "csv", "parquet")}
    for fmt, path in paths.items():
        written = lab.download(flow.release, path, format=fmt)  # type: ignore[arg-type]
        assert written == path.stat().st_size > 0
        assert not path.with_name(path.name + ".part").exists()

    records = [json.loads(line) for line in paths["jsonl"].read_text("utf-8").splitlines()]
    assert len(records) == 2 * PER_CLASS
    assert {r["label"] for r in records} == set(factories.LABELS)
    assert all(
        len(r["keyphrases"]) == 3 and set(r["keyphrases"]) <= set(factories.PHRASES)
        for r in records
    )
    assert all(r["text"] == " ".join(r["keyphrases"]) for r in records)  # llm: none

    # Parquet: the same rows and types as the JSONL, in three row groups of the stream
    parquet = pq.ParquetFile(paths["parquet"])
    assert parquet.schema_arrow.names == ["label", "text", "keyphrases"]
    assert parquet.metadata.num_row_groups == 3
    assert [parquet.metadata.row_group(i).num_rows for i in range(3)] == [1000, 1000, 500]
    assert pq.read_table(paths["parquet"]).to_pylist() == records

    # CSV: the same rows, phrases joined, cells escaped
    with paths["csv"].open(encoding="utf-8", newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["label", "text", "keyphrases"]
    assert rows[1:] == [
        [escape_cell(r["label"]), escape_cell(r["text"]), escape_cell("; ".join(r["keyphrases"]))]
        for r in records
    ]

    # into a file object, a chunk at a time: never the whole corpus in one piece
    for fmt, chunk_size in (("jsonl", 4096), ("parquet", 256)):
        sink = _Chunks()
        written = lab.download(flow.release.id, sink, format=fmt, chunk_size=chunk_size)  # type: ignore[arg-type]
        assert sink.getvalue() == paths[fmt].read_bytes() and written == len(sink.getvalue())
        assert sink.writes > 5 and sink.largest_write <= chunk_size

    # the records one by one, from the JSONL stream
    assert list(lab.iter_release(flow.release)) == records

    # and the owner downloads its own release too
    assert (
        flow.owner.download(flow.release, tmp_path / "own.jsonl") == paths["jsonl"].stat().st_size
    )

    # compressed: the same bytes once decompressed
    packed = tmp_path / "corpus.csv.gz"
    assert lab.download(flow.release, packed, format="csv", compression="gzip") > 0
    assert gzip.decompress(packed.read_bytes()) == paths["csv"].read_bytes()


def test_the_parquet_export_sends_each_row_group_as_it_is_written(
    service: Service, flow: Flow
) -> None:
    chunks = export.parquet_chunks(service.database, flow.job.id, texts_only=False)
    first = next(chunks)
    assert first.startswith(b"PAR1")  # the magic number and the first row group, alone
    rest = list(chunks)
    assert len(rest) == 3  # two more row groups, then the footer
    assert rest[-1].endswith(b"PAR1")
    table = pq.read_table(io.BytesIO(first + b"".join(rest)))
    assert table.num_rows == 2 * PER_CLASS


def test_the_privacy_officer_reads_the_ledger_and_the_audit_trail(flow: Flow) -> None:
    # every download is an audit event (the other test's first)
    flow.lab.download(flow.release, io.BytesIO(), format="parquet")
    officer = flow.auditor
    ledger = officer.ledger(flow.dataset)
    assert ledger.dataset_id == flow.dataset.id
    kinds = [(e.job_id, e.kind) for e in ledger.entries]
    assert (flow.job.id, "reserve") in kinds and (flow.job.id, "commit") in kinds
    assert (flow.cancelled.job.id, "release") in kinds  # the cancelled job's reservation
    assert ledger.budget.spent == 1.0 and ledger.budget.reserved == 0.0
    assert ledger.budget.remaining == 1.0
    commit = next(e for e in ledger.entries if e.kind == "commit")
    assert commit.epsilon_by_mechanism == {"vocabulary": 0.5, "kde": 0.5} and commit.events
    assert [r.job_id for r in ledger.reports] == [flow.job.id]
    assert ledger.reports[0].differences == []

    page = officer.audit_events(kind="release.downloaded", target_id=str(flow.release.id))
    assert page.events and all(e.kind == "release.downloaded" for e in page.events)
    assert "parquet" in {e.details["format"] for e in page.events}
    assert page.events == sorted(page.events, key=lambda e: e.id, reverse=True)
    one_by_one = list(officer.iter_audit_events(kind="release.downloaded", limit=1))
    assert [e.id for e in one_by_one] == [e.id for e in page.events]
    every = list(officer.iter_audit_events(organisation=flow.hospital_id, limit=7))
    assert {"dataset.uploaded", "job.submitted", "release.created"} <= {e.kind for e in every}
    # a worker's entries carry no time for the officer (it would grow with the corpus)
    assert all(e.created_at is None for e in ledger.entries if e.actor.startswith("system:"))
    assert all(r.created_at is None for r in ledger.reports)
    # the owner reads its own dataset's ledger as well, with every time
    own = flow.owner.ledger(flow.dataset.id).entries
    assert all(e.created_at is not None for e in own)
    assert [e.model_copy(update={"created_at": None}) for e in own] == [
        e.model_copy(update={"created_at": None}) for e in ledger.entries
    ]


# ------------------------------------------------------------------ refusals, typed


def test_an_unknown_or_hidden_object_is_not_found(flow: Flow) -> None:
    with pytest.raises(NotFound) as missing:
        flow.owner.get_job(uuid.uuid4())
    problem = missing.value
    assert (problem.status, problem.title) == (404, "Not Found")
    assert problem.detail and problem.instance and problem.instance.startswith("/v1/jobs/")
    with pytest.raises(NotFound):
        flow.other_lab.get_release(flow.release)  # not granted: not there
    with pytest.raises(NotFound):
        flow.other_lab.download(flow.release.id, io.BytesIO(), format="csv")


def test_a_job_over_the_cap_is_refused_as_budget_exceeded_with_the_figures(flow: Flow) -> None:
    vocabulary = flow.submitted.spec["vocabulary"]
    with pytest.raises(BudgetExceeded) as refused:
        flow.owner.submit_job(flow.dataset, _spec(vocabulary, epsilon_vocab=1, epsilon_kde=1))
    problem = refused.value
    assert isinstance(problem, Conflict) and problem.status == 409
    assert problem.title == "Privacy budget exceeded"
    assert problem.detail is not None and "asks for ε = 2" in problem.detail
    assert "ε = 1 left" in problem.detail
    assert problem.requested == {"epsilon": 2.0, "delta": 0.0}
    assert problem.remaining == {"epsilon": 1.0, "delta": 0.0}
    assert problem.extra["cap"] == {"epsilon": 2.0, "delta": 0.0}
    assert problem.problem["detail"] == problem.detail
    # the refused job was not kept; its dry run gets the same refusal (issue 66, item 5),
    # and the dry run of a job that fits gives its plan
    assert len(flow.owner.list_jobs(flow.dataset)) == 2
    with pytest.raises(BudgetExceeded) as dry:
        flow.owner.dry_run(flow.dataset, _spec(vocabulary, epsilon_vocab=1))
    assert dry.value.remaining == {"epsilon": 1.0, "delta": 0.0}
    fits = flow.owner.dry_run(flow.dataset, _spec(vocabulary, epsilon_vocab=0.25, epsilon_kde=0.25))
    assert fits.epsilon == 0.5


def test_an_upload_cap_beyond_the_organisation_budget_is_budget_exceeded(
    flow: Flow, tmp_path: Path
) -> None:
    notes = tmp_path / "notes.csv"
    notes.write_bytes(factories.csv_bytes(factories.ROWS))
    with pytest.raises(BudgetExceeded) as refused:
        _upload_notes(flow.owner, notes, name="too big", epsilon_cap=1000)
    assert refused.value.detail and "organisation has" in refused.value.detail
    assert refused.value.remaining is not None


def test_other_refusals_carry_their_class_and_the_problem_members(flow: Flow) -> None:
    vocabulary = flow.submitted.spec["vocabulary"]
    with pytest.raises(ValidationFailed) as invalid:
        flow.owner.dry_run(flow.dataset, _spec(vocabulary, mode="greedy"))
    assert invalid.value.field == "mode" and invalid.value.errors
    assert invalid.value.status == 422

    with pytest.raises(Conflict) as twice:
        flow.owner.release(flow.job, [flow.lab_id])
    assert type(twice.value) is Conflict and "released already" in str(twice.value)

    with pytest.raises(Forbidden):  # platform keys never download a corpus
        flow.admin.download(flow.release, io.BytesIO())
    with pytest.raises(Forbidden):
        flow.lab.submit_job(flow.dataset, _spec(vocabulary))

    zipped = io.BytesIO(gzip.compress(factories.csv_bytes(factories.ROWS)))
    with pytest.raises(UnsupportedMediaType):
        _upload_notes(flow.owner, zipped, name="zipped", epsilon_cap=0.1, filename="notes.csv")

    # rows whose label was not declared: the rows named, never their text
    undeclared = io.BytesIO(factories.csv_bytes([("secret note text", "neuro")]))
    with pytest.raises(ValidationFailed) as rows:
        _upload_notes(
            flow.owner, undeclared, name="bad labels", epsilon_cap=0.1, filename="notes.csv"
        )
    assert "secret note text" not in json.dumps(rows.value.problem, ensure_ascii=False)
    assert "secret note text" not in str(rows.value)
    assert isinstance(rows.value, KeyseedError)


# ------------------------------------------------------------------ helpers


def _upload_notes(owner: Client, file: Path | IO[bytes], **options: Any) -> Dataset:
    """Upload a CSV of the factories' notes: a ``text`` and a ``label`` column, the
    factories' labels declared."""
    return owner.upload_dataset(
        file, text_columns=["text"], label_column="label", labels=factories.LABELS, **options
    )


class _Unsized(io.RawIOBase):
    """A pipe-like binary stream: no size, no seeking; counts what it is asked for."""

    def __init__(self, content: bytes) -> None:
        super().__init__()
        self._content = memoryview(content)
        self._at = 0
        self.reads = 0
        self.largest_read = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            raise AssertionError("the client read the whole stream at once")
        self.reads += 1
        self.largest_read = max(self.largest_read, size)
        chunk = bytes(self._content[self._at : self._at + size])
        self._at += len(chunk)
        return chunk


class _Chunks(io.BytesIO):
    """A file object that counts its writes and their largest size."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.largest_write = 0

    def write(self, data: Any) -> int:
        self.writes += 1
        self.largest_write = max(self.largest_write, len(data))
        return super().write(data)


def test_an_answer_that_is_no_problem_body_still_raises_by_status() -> None:
    # what a proxy in front of the service may send: an HTML page, or uvicorn's own text
    page = httpx.Response(
        502, text="<html>bad gateway</html>", headers={"content-type": "text/html"}
    )
    error = KeyseedError.from_response(page)
    assert isinstance(error, ServerError)
    assert (error.status, error.title, error.detail, error.extra) == (502, "Bad Gateway", None, {})
    text = httpx.Response(
        408, text="the request did not arrive in time\n", headers={"content-type": "text/plain"}
    )
    late = KeyseedError.from_response(text)
    assert type(late) is KeyseedError and late.title == "Request Timeout"
    assert late.detail == "the request did not arrive in time"


def test_a_service_that_cannot_be_reached_is_not_ready() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    with Client(f"http://127.0.0.1:{port}", "any", timeout=2) as nowhere:
        assert nowhere.ready() is False
        with pytest.raises(httpx.ConnectError):
            nowhere.list_releases()
