"""The applier reads the memory log wherever Flink wrote it (a path, file://, s3://, any fsspec scheme) and
stops loudly on a location it cannot read; applied files are retired so a poll lists only the recent log; the
applier's lag is recorded for readers, and the job's watch tells when no applier takes its commits."""

import os
import time

import fsspec
import pytest
from test_store_log import LogFiles, item, pipeline

from flink_memory.cli import main
from flink_memory.store import live_view, open_store
from flink_memory.store.applier import LogApplier, apply_committed
from flink_memory.store.lag import CommitWatch
from flink_memory.store.log_location import LocationError, LogLocation


def a_log(tmp_path):
    """A job's committed memory log (one file per entry) and the live view its summaries make."""
    run = pipeline().feed(*[item(a, i) for i in range(4) for a in ("a", "b")]).settle().advance(61)
    files = LogFiles(tmp_path / "out")
    for entry in run.log:
        files.commit([entry])
    return run, files


def stored(store):
    return {(a, n.node_id): n for a in store.agents() for n in store.nodes(a)}


@pytest.mark.parametrize("form", ["path", "relative", "file"])
def test_local_paths_and_file_urls_are_read_alike(tmp_path, form, monkeypatch):
    run, files = a_log(tmp_path)
    monkeypatch.chdir(tmp_path)
    output = {"path": str(files.output), "relative": "out", "file": files.output.as_uri()}[form]
    with open_store(str(tmp_path / "memory.sqlite"), create=True) as store:
        assert apply_committed(store, output) == len(run.log)
        assert stored(store) == live_view(run.summaries)


def test_any_fsspec_filesystem_is_read_through_fsspec(tmp_path):
    run, files = a_log(tmp_path)
    memory = fsspec.filesystem("memory")
    for path in files.folder.iterdir():
        memory.pipe(f"/job-{os.getpid()}/out/memory/{path.name}", path.read_bytes())
    with open_store(str(tmp_path / "memory.sqlite"), create=True) as store:
        assert apply_committed(store, f"memory://job-{os.getpid()}/out") == len(run.log)
        assert stored(store) == live_view(run.summaries)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A local S3 endpoint (moto's server, in this process) and a bucket; the AWS settings point at it."""
    pytest.importorskip("moto.server")
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    settings = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1",
                "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    before = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    client = boto3.client("s3")
    client.create_bucket(Bucket="memory-bucket")
    yield client
    server.stop()
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def test_an_s3_log_is_applied_and_its_applied_files_retired(tmp_path, s3):
    run, files = a_log(tmp_path)
    names = sorted(p.name for p in files.folder.iterdir())
    for name in names:
        s3.put_object(Bucket="memory-bucket", Key=f"job/out/memory/{name}", Body=(files.folder / name).read_bytes())
    s3.put_object(Bucket="memory-bucket", Key="job/out/memory/.part-x.inprogress", Body=b"not committed")
    with open_store(str(tmp_path / "memory.sqlite"), create=True) as store:
        applier = LogApplier(store, LogLocation("s3://memory-bucket/job/out"), keep_applied_s=0)
        assert applier.poll() == len(run.log)
        assert stored(store) == live_view(run.summaries)
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="memory-bucket", Prefix="job/out/")["Contents"]
            if not o["Key"].endswith("/")}  # (pyarrow keeps a folder's marker object)
    assert keys == {"job/out/memory/.part-x.inprogress"} | {f"job/out/memory-applied/{n}" for n in names}


def test_an_unreadable_location_fails_loudly(tmp_path, s3, capsys):
    with pytest.raises(LocationError, match="no filesystem for the scheme 'nosuch'"):
        LogLocation("nosuch://host/out")
    with pytest.raises(LocationError, match="bucket 'no-such-bucket' does not exist"):
        LogLocation("s3://no-such-bucket/out").check()
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(LocationError, match="is a file"):
        LogLocation(str(tmp_path / "a-file")).check()
    store = str(tmp_path / "memory.sqlite")
    for output in ("nosuch://host/out", "s3://no-such-bucket/out", tmp_path / "a-file", tmp_path / "nothing-here",
                   (tmp_path / "nothing-here").as_uri()):
        assert main(["apply", "--output", str(output), "--store", store]) == 2, output
        assert str(output).split("://")[-1] in capsys.readouterr().err
    assert main(["apply", "--output", "s3://no-such-bucket/out", "--store", store, "--follow"]) == 2


def test_applied_files_leave_the_polled_folder_after_keep_applied_s_and_expire_after_retention(tmp_path):
    run, files = a_log(tmp_path)
    old = time.time() - 7200
    paths = sorted(files.folder.iterdir())
    for path in paths[:-2]:  # committed two hours ago; the last two just now
        os.utime(path, (old, old))
    clock = [time.time()]
    with open_store(str(tmp_path / "memory.sqlite"), create=True) as store:
        applier = LogApplier(store, files.folder, keep_applied_s=3600, retention_s=86400, clock=lambda: clock[0])
        assert applier.poll() == len(run.log)
        assert sorted(p.name for p in files.folder.iterdir()) == [p.name for p in paths[-2:]]
        retired = files.output / "memory-applied"
        assert sorted(p.name for p in retired.iterdir()) == [p.name for p in paths[:-2]]
        assert applier.committed_files() == []
        assert len(applier.location.committed()) == 2  # what the next poll lists, however old the log
        clock[0] += 86400 - 3600 + 1200  # past the retention of the old ones, not of the recent ones
        applier._expired = 0.0
        applier.poll()  # the recent ones are retired in turn; the old ones are deleted
        assert not any(files.folder.iterdir())
        assert sorted(p.name for p in retired.iterdir()) == [p.name for p in paths[-2:]]
        assert stored(store) == live_view(run.summaries)
        assert applier.lag.written == applier.lag.applied == len(paths)
    with open_store(str(tmp_path / "memory.sqlite")) as store:  # a second applier: nothing left to apply
        assert LogApplier(store, files.folder).poll() == 0


def test_the_lag_counts_commits_written_and_applied_and_the_oldest_unapplied_one(tmp_path):
    run, files = a_log(tmp_path)
    paths = sorted(files.folder.iterdir())
    held = paths[0]  # the first commit is not visible yet: everything after it waits for it
    hidden = held.with_name("." + held.name)
    held.rename(hidden)
    written_at = time.time() - 30
    for path in paths[1:]:
        os.utime(path, (written_at, written_at))
    with open_store(str(tmp_path / "memory.sqlite"), create=True) as store:
        applier = LogApplier(store, files.folder)
        applier.poll()
        lag = store.applier_lag()
        assert lag is not None and lag.log == applier.log_dir
        assert (lag.written, lag.unapplied) == (len(paths) - 1, lag.written - lag.applied)
        assert lag.unapplied > 0 and 29 < lag.oldest_unapplied_age_s(time.time()) < 60
        hidden.rename(held)
        applier.poll()
        applier._lag_recorded = 0.0
        applier.poll()
        lag = store.applier_lag()
        assert (lag.written, lag.applied, lag.oldest_unapplied_age_s(time.time())) == (len(paths), len(paths), 0.0)


def stop_at_once():
    import threading

    stop = threading.Event()
    stop.set()
    return stop


def test_the_service_health_answers_the_applier_lag_and_degrades_when_it_is_behind(tmp_path):
    from flink_memory.service.memory import MemoryService

    run, files = a_log(tmp_path)
    location = str(tmp_path / "memory.sqlite")
    with open_store(location, create=True) as store:
        service = MemoryService(location, read_only=True, applier_warn_after_s=120)
        assert service.health().applier is None
        LogApplier(store, files.folder).poll()
        health = service.health()
        assert health.status == "ok" and health.applier.written == health.applier.applied == len(run.log)
        for path in files.folder.iterdir():
            os.utime(path, (time.time() - 600, time.time() - 600))
        # a commit that has waited ten minutes (for an entry of another commit that never came)
        late = files.commit([run.log[-1].model_copy(update={"seq": run.log[-1].seq + 100})])
        os.utime(late, (time.time() - 600, time.time() - 600))
        LogApplier(store, files.folder).follow(stop_at_once())
        health = service.health()
        assert health.status == "degraded" and health.applier.unapplied == 1
        assert health.applier.oldest_unapplied_age_s > 590


def test_the_job_notices_when_no_applier_takes_its_commits():
    watch = CommitWatch(warn_after_s=60)
    positions = {("a", "batcher"): 0, ("a", "merger"): 0, ("b", "batcher"): 0}
    for t, (agent, by, seq) in enumerate([("a", "batcher", 1), ("a", "batcher", 2), ("a", "merger", 1),
                                          ("b", "batcher", 1)]):
        watch.wrote(agent, by, seq, now=1000.0 + 2 * t)
    read = lambda agent, by: positions[(agent, by)]  # noqa: E731
    assert watch.overdue(read, now=1030.0) is None  # not yet: commits come at checkpoints
    assert watch.overdue(read, now=1070.0) == 70.0
    positions.update({("a", "batcher"): 2, ("a", "merger"): 1})  # an applier took a's commits, not b's yet
    assert watch.overdue(read, now=1070.0) == 64.0
    positions[("b", "batcher")] = 1
    assert watch.overdue(read, now=1070.0) is None and not watch.marks
    for seq in range(3, 1000):  # marks stay bounded: one per resolution, however many entries
        watch.wrote("a", "batcher", seq, now=2000.0 + seq / 1000)
    assert len(watch.marks[("a", "batcher")]) <= 2


def test_the_progress_line_says_when_no_applier_takes_the_commits():
    from flink_memory.cli.progress import ProgressLine
    from flink_memory.store.lag import Lag, lag_note

    lag = Lag(log="s3://b/out/memory", written=12, applied=9, oldest_unapplied_at=1000.0, polled_at=1100.0)
    assert lag_note(lag, now=1100.0, warn_after_s=120) is None  # 100 s: commits come at checkpoints
    note = lag_note(lag, now=1130.0, warn_after_s=120)
    assert note == "store: 3 of 12 commits not applied, the oldest for 130 s (no applier takes them)"
    caught_up = lag.model_copy(update={"applied": 12, "oldest_unapplied_at": None})
    assert lag_note(caught_up, now=5000.0, warn_after_s=120) is None
    line = ProgressLine(0, "job", note=lambda: note).line({"records_in": 3})
    assert line.endswith(f" | {note}")


def test_a_file_another_applier_retired_since_the_listing_is_skipped(tmp_path):
    run, files = a_log(tmp_path)
    with open_store(str(tmp_path / "memory.sqlite"), create=True) as store:
        first, second = LogApplier(store, files.folder, keep_applied_s=0), LogApplier(store, files.folder)
        listed = second.committed_files()
        assert first.poll() == len(run.log) and not any(files.folder.iterdir())
        for file in listed:  # (what the second one listed is gone: it reads nothing, applies nothing twice)
            second._read(file.name)
        assert not second.unfinished and second.poll() == 0
        assert stored(store) == live_view(run.summaries)
