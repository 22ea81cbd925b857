"""One engine in a child process, for every real-engine check and benchmark: the spec goes in
as a JSON file, the child (the calling script run with ``--engine SPEC OUT``) writes its
results as JSON, and the parent gets them back, or an error with the log's tail. The child has
a deadline: a stuck engine costs a failed check, never a stuck run. Shared by
tests/vllm/engine_check.py and bench/vllm_engine_bench.py (and any engine's checks: the child
protocol names no engine)."""

import json
import os
import subprocess
import sys
import time


def run_child(script, root, tag, spec, timeout):
    """Runs ``script --engine SPEC OUT`` with this interpreter; returns its JSON with
    ``wall_s`` added. Raises RuntimeError naming the engine and its log on a failure or a
    timeout."""
    spec_path = os.path.join(root, f"{tag}.spec.json")
    out_path = os.path.join(root, f"{tag}.out.json")
    log_path = os.path.join(root, f"{tag}.log")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    t0 = time.time()
    with open(log_path, "w") as log:
        try:
            rc = subprocess.run([sys.executable, os.path.abspath(script), "--engine", spec_path,
                                 out_path], stdout=log, stderr=subprocess.STDOUT,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = f"timeout after {timeout} s"
    if rc != 0 or not os.path.exists(out_path):
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"engine {tag} failed (rc {rc}); log {log_path}:\n{tail}")
    with open(out_path) as f:
        r = json.load(f)
    r["wall_s"] = time.time() - t0
    return r


def lanes():
    """How many engines run side by side: KVOFFLOAD_ENGINE_LANES, else up to 2 on a machine
    with 2 cores or more. An engine on the CPU keeps about one core busy (its start is Python
    imports, its tiny models' steps are short), so two at once nearly halve the wall time."""
    value = os.environ.get("KVOFFLOAD_ENGINE_LANES")
    if value is not None:
        if not value.isdigit() or int(value) < 1:
            raise SystemExit(f"KVOFFLOAD_ENGINE_LANES={value!r}: a positive number")
        return int(value)
    return max(1, min(2, os.cpu_count() or 1))


def run_tasks(tasks, lanes):
    """Runs the callables, up to `lanes` at once, in the given order (longest first keeps the
    lanes even), and waits for all. The first exception a task raised is raised here once all
    have ended: a task's own failures are its lines, not exceptions."""
    from concurrent.futures import ThreadPoolExecutor
    if lanes <= 1:
        for task in tasks:
            task()
        return
    with ThreadPoolExecutor(lanes) as pool:
        futures = [pool.submit(task) for task in tasks]
    for f in futures:
        f.result()
