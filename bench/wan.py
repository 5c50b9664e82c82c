"""Rollout workers in a simulated far region against workers next to the broker, on one machine.

The region (astraflow.net.regions) is a network namespace behind a veth limited by tbf and a link
proxy adding one-way delay, jitter and loss-like stalls; the broker gives it its own listener and
the trainer serves weights over HTTP, both reached only through the proxy. Reported:

1. the link as measured from inside the region (RTT, bulk rate), through the proxy and over the
   bare veth (rate limit only);
2. per case, one worker each, the same recipe: trainer steps/min and mean staleness over the same
   window of steps, and bytes through the link per weight version against the snapshot and delta
   sizes in the weight store. Cases: `local` (worker in the host namespace, default Kafka
   settings), `region-wan` (worker in the region, `kafka.wan` via ASTRAFLOW_WAN=1), `region-default`;
3. in the region cases: a late-joining second worker's catch-up time (to the current weights and
   to its first partition assignment), then a 30 s partition of the region: trainer steps during
   it, time from the heal to the next step, rebalances and worker survival.

    nice -n 15 python -m bench.wan [--steps 8] [--partition-s 30] [--cases local,region-wan,region-default]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from astraflow.net.linkproxy import Link
from astraflow.net.regions import Region
from bench import wanlink
from bench.machine import describe
from tests.conftest import subprocess_env, worker_cmd
from tests.e2e.helpers import recipe_copy, start_run
from tests.wan.helpers import wan_site

LINK = Link(delay_ms=150, jitter_ms=20, loss=0.005)
RATE_MBIT = 100


def trainer_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("id") == "trainer.solver" and r.get("step", -1) >= 0]


def wait_step(run_dir: Path, step: int, timeout: float, proc: subprocess.Popen[str]) -> float | None:
    """Wall time at which the trainer reached `step` (None on timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in trainer_rows(run_dir):
            if r["step"] >= step:
                return float(r["time"])
        if proc.poll() is not None:
            raise RuntimeError(f"the run exited with {proc.returncode}")
        time.sleep(1)
    return None


def window(run_dir: Path, first: int, last: int) -> dict[str, float]:
    by_step = {r["step"]: r for r in trainer_rows(run_dir)}
    a, b = by_step[first], by_step[last]
    stale = [
        by_step[s]["values"].get("staleness.mean", 0.0) for s in range(first + 1, last + 1) if s in by_step
    ]
    return {
        "steps": last - first,
        "seconds": round(b["time"] - a["time"], 1),
        "steps_per_min": round((last - first) * 60 / (b["time"] - a["time"]), 2),
        "staleness_mean": round(sum(stale) / len(stale), 3),
    }


def log_times(log: Path, pattern: str) -> list[float]:
    """Times of log lines matching `pattern` (the CLI logs `YYYY-mm-dd HH:MM:SS,mmm LEVEL ...`)."""
    out = []
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if re.search(pattern, line):
            m = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})", line)
            if m:
                out.append(
                    time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
                )
    return out


def store_sizes(run_dir: Path) -> dict[str, float]:
    manifest = json.loads(next((run_dir / "weights").glob("*/manifest.json")).read_text())
    snaps = [e["snapshot"]["bytes"] for e in manifest["versions"].values() if e.get("snapshot")]
    deltas = [e["delta"]["bytes"] for e in manifest["versions"].values() if e.get("delta")]
    return {
        "snapshot_bytes": max(snaps, default=0),
        "delta_bytes_mean": round(sum(deltas) / max(1, len(deltas))),
    }


def fetched_files(run_dir: Path) -> dict[str, float]:
    """What the workers' shared cache holds: every weight file fetched, each once."""
    sizes = [
        p.stat().st_size for p in (run_dir / "cache" / "weights").glob("*") if not p.name.endswith(".part")
    ]
    snapshot = store_sizes(run_dir)["snapshot_bytes"]
    deltas = [s for s in sizes if s != snapshot and s >= 1000]
    return {
        "files": len(sizes),
        "bytes": sum(sizes),
        "snapshots": sum(s == snapshot for s in sizes),
        "deltas": len(deltas),
        "delta_bytes_mean": round(sum(deltas) / max(1, len(deltas))),
        "empty_deltas": sum(s < 1000 for s in sizes),
    }


def run_case(case: str, region: Region, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    in_region = case.startswith("region")
    result: dict[str, Any] = {"case": case}
    with wan_site(region, tmp / f"kafka-{case}") as site:
        ns = f"wanb{uuid.uuid4().hex[:8]}"
        host = region.host_ip
        trainer = {
            "batch_groups": 4,
            "serve_http": True,
            "http_host": host,
            "http_port": site.http_port,
            "advertise_host": "127.0.0.1" if in_region else host,
        }
        (tmp / case).mkdir()
        recipe = recipe_copy(
            "arithmetic",
            tmp / case,
            worker={"count": 0, "max_episodes": 16},
            trainer=trainer,
            run={"max_steps": None},
        )
        run_dir = tmp / case / "run"
        env = subprocess_env(ASTRAFLOW_BOOTSTRAP=site.bootstrap, ASTRAFLOW_NAMESPACE=ns)
        total = 2 + args.steps + (args.steps if in_region else 0) + 1000
        proc = start_run(recipe, run_dir, env, "--workers", "0", "--max-steps", str(total))
        workers: list[subprocess.Popen[Any]] = []
        logs = [tmp / case / f"worker-{i}.log" for i in range(2)]

        def start_worker(i: int) -> float:
            started = time.time()
            wenv = {"ASTRAFLOW_LOG_LEVEL": "INFO"} | ({"ASTRAFLOW_WAN": "1"} if case == "region-wan" else {})
            if in_region:
                workers.append(
                    region.popen(
                        worker_cmd(recipe, run_dir, f"w{i}"),
                        env=site.region_env(ns, **wenv),
                        log=logs[i],
                    )
                )
            else:
                with open(logs[i], "ab") as out:
                    workers.append(
                        subprocess.Popen(
                            worker_cmd(recipe, run_dir, f"w{i}"),
                            env=env | wenv,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    )
            return started

        try:
            deadline = time.monotonic() + 300
            while (
                not (run_dir / "metrics.jsonl").exists()
                and time.monotonic() < deadline
                and proc.poll() is None
            ):
                time.sleep(1)
            start_worker(0)
            if wait_step(run_dir, 2, 900, proc) is None:
                raise RuntimeError(f"{case}: no second step within 900 s")
            before = site.link_bytes()
            applied0 = len(log_times(logs[0], r"now at weight version"))
            if wait_step(run_dir, 2 + args.steps, 1800, proc) is None:
                raise RuntimeError(f"{case}: the window of {args.steps} steps did not finish")
            after = site.link_bytes()
            applied = len(log_times(logs[0], r"now at weight version")) - applied0
            result["window"] = window(run_dir, 2, 2 + args.steps)
            result["versions_applied"] = applied
            result["link"] = {k: {d: after[k][d] - before[k][d] for d in ("up", "down")} for k in after}
            if in_region:
                weights_down = result["link"]["weights"]["down"]
                result["weights_bytes_per_version"] = round(weights_down / max(1, applied))
                kafka = result["link"]["kafka"]
                result["kafka_bytes_per_step"] = {d: round(kafka[d] / args.steps) for d in ("up", "down")}
            result["late_joiner"] = late_joiner(start_worker, logs[1], site)
            if in_region:
                result["partition"] = partition(region, run_dir, proc, logs, args.partition_s)
            result["store"] = store_sizes(run_dir)
            result["fetched_files"] = fetched_files(run_dir)
            result["workers_alive"] = [w.poll() is None for w in workers]
        finally:
            for w in workers:
                region.stop(w) if in_region else _stop(w)
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(180)
                except subprocess.TimeoutExpired:
                    proc.kill()
    return result


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def late_joiner(start_worker: Any, log: Path, site: Any) -> dict[str, Any]:
    before = site.link_bytes()["weights"]["down"]
    started = start_worker(1)
    deadline = time.time() + 300
    weights = assigned = None
    while time.time() < deadline and (weights is None or assigned is None):
        time.sleep(1)
        w, a = log_times(log, r"now at weight version"), log_times(log, r"assigned \[\d")
        weights = w[0] if w else None
        assigned = a[0] if a else None
    up = log_times(log, r"consuming")  # caught up with the weights topic, subscribing to tasks
    return {
        "to_consuming_s": round(up[0] - started, 1) if up else None,
        "to_current_weights_s": round(weights - started, 1) if weights else None,
        "to_first_assignment_s": round(assigned - started, 1) if assigned else None,
        "weights_bytes_while_joining": site.link_bytes()["weights"]["down"] - before,
    }


def partition(
    region: Region, run_dir: Path, proc: subprocess.Popen[str], logs: list[Path], secs: float
) -> dict[str, Any]:
    """Cut the region off for `secs`; then the trainer's steps during the cut and after the heal (from
    the trainer's own step times, which reach metrics.jsonl late), and the workers' rebalances."""
    cut = time.time()
    region.partition()
    time.sleep(secs)
    region.heal()
    healed = time.time()
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not any(r["time"] > healed for r in trainer_rows(run_dir)):
        if proc.poll() is not None:
            break
        time.sleep(1)
    time.sleep(max(10.0, healed + 60 - time.time()))  # the minute after the heal, rebalances included
    times = sorted(r["time"] for r in trainer_rows(run_dir))
    after = [t for t in times if t > healed]
    events = sorted(
        (round(t - cut, 1), f"w{i} {kind}")
        for i, log in enumerate(logs)
        for kind, pattern in (("revoked", r"revoked \[\d"), ("assigned", r"assigned \[\d"))
        for t in log_times(log, pattern)
        if t > cut - 5
    )
    return {
        "seconds": secs,
        "steps_during": sum(cut <= t <= healed for t in times),
        "heal_to_next_step_s": round(after[0] - healed, 1) if after else None,
        "steps_in_60s_after_heal": sum(healed < t <= healed + 60 for t in times),
        "rebalance_events_s_from_cut": events,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--partition-s", type=float, default=30.0)
    parser.add_argument("--cases", default="local,region-wan,region-default")
    parser.add_argument("--no-link-probe", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument(
        "--keep", type=Path, default=None, help="work in this directory and keep it (logs, runs)"
    )
    args = parser.parse_args()
    print(f"machine: {describe()}", flush=True)
    results: dict[str, Any] = {"machine": describe(), "link_spec": {**LINK.__dict__, "rate_mbit": RATE_MBIT}}
    if args.keep:
        args.keep.mkdir(parents=True)
    with (
        (
            contextlib.nullcontext(str(args.keep))
            if args.keep
            else tempfile.TemporaryDirectory(prefix="bench-wan-")
        ) as tmpdir,
        Region.create("far", LINK, RATE_MBIT) as region,
    ):
        tmp = Path(tmpdir)
        if not args.no_link_probe:
            results["link"] = measure_link(region, tmp)
            print(json.dumps(results["link"], indent=1), flush=True)
        for case in args.cases.split(","):
            results[case] = run_case(case, region, tmp, args)
            print(json.dumps(results[case], indent=1), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


def measure_link(region: Region, tmp: Path) -> list[dict[str, Any]]:
    listener, port = wanlink.serve(region.host_ip)
    stats = tmp / "probe-link.json"
    proxy = region.start_proxy([port], stats, log=tmp / "probe-link.log", env=subprocess_env())
    try:
        out = tmp / "probe.jsonl"
        client = region.popen(
            [sys.executable, "-m", "bench.wanlink", "127.0.0.1", str(port), region.host_ip, str(port)],
            env=subprocess_env(),
            log=out,
        )
        client.wait(600)
        rows = [json.loads(line) for line in out.read_text().splitlines() if line.startswith("{")]
        for row, via in zip(rows, ("link proxy + tbf", "bare veth (tbf only)"), strict=False):
            row["via"] = via
        return rows
    finally:
        region.stop(proxy)
        region.procs.remove(proxy)
        listener.close()


if __name__ == "__main__":
    main()
