#!/usr/bin/env python3
"""Mutation check for the CUDA backend's simulated-device tests (issue 26).

Each mutation puts back one bug a review found (or one ordering mistake the simulator must
see) into the source, rebuilds the debug build, and runs the [sim] test that must catch it.
A mutation is "caught" when that test fails. The sources are restored after each one.

    tests/backend/sim_mutations.py [NAME...]

Builds in build/mutations (the debug preset). Not part of scripts/test: each mutation rebuilds
the library and relinks the test binary (about a minute here).
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, "build/mutations")  # its own build: the sources change under it
TESTS = os.path.join(BUILD, "tests/kvoffload_tests")

# name, file, text to find, replacement, the test that must fail
MUTATIONS = [
    ("compactor-shared-temp", "src/transfer/cuda/device_compactor.cpp",
     "  if (recorded_) fail(rt_->stream_wait_event(stream, last_), \"stream_wait_event\");\n", "",
     "sim: one compactor on two streams at once keeps each call's results"),
    ("thrown-submission-ok", "src/transfer/cuda/cuda_backend_impl.hpp",
     "    bool failed = true;\n", "    bool failed = false;\n",
     "sim: a submission that throws after its job is queued reports the job failed"),
    ("scope-set-device", "src/transfer/cuda/device_scope.hpp",
     "    const int e = rt.push_device(device);\n",
     # the old restore: set_device(previous), previous being 0 on a thread with no context
     "    int previous = 0;\n    (void)rt.get_device(&previous);\n"
     "    (void)rt.set_device(previous);\n    const int e = rt.push_device(device);\n",
     "sim: a backend on device 1 used from a thread with no context creates none on 0"),
    ("trusted-total-bytes", "src/transfer/cuda/cuda_backend.cpp",
     "  KVOFFLOAD_EXPECTS(sum == plan.total_bytes,", "  KVOFFLOAD_EXPECTS(true || sum == plan.total_bytes,",
     "sim: a plan whose total_bytes disagrees with its copies is refused at submit"),
    ("unbounded-ctas", "src/transfer/cuda/cuda_backend.cpp",
     "config.kernel_ctas <= detail::kMaxKernelCtas,", "config.kernel_ctas <= INT32_MAX,",
     "sim: kernel launch shapes are bounded so the warp count cannot wrap"),
    ("batch-store-any-order", "src/transfer/cuda/cuda_backend_impl.hpp",
     "plan.descriptors.size(),\n                                             store, stream, &fail);",
     "plan.descriptors.size(),\n                                             false, stream, &fail);",
     "sim: stores after one forward pass wait for it on every stream they land on"),
    ("compute-event-wrong-device", "src/transfer/cuda/cuda_backend_impl.hpp",
     "    Scope scope(*rt, config.device);  // the event belongs to the backend's device\n", "",
     "sim: a compute stream set from a thread on another device orders the stores"),
    ("device-table-no-compute-wait", "src/transfer/cuda/cuda_device_table.cpp",
     "if (e == dev::ok) e = s.wait_for_compute(stream, true, std::nullopt);", "",
     "sim: the device-table path reads a table the engine writes on its compute stream"),
    ("compute-wait-first-stream-only", "src/transfer/cuda/cuda_backend_impl.hpp",
     "if (e == dev::ok) e = rt->stream_wait_event(stream, compute_ready);",
     "if (e == dev::ok) e = rt->stream_wait_event(streams[0], compute_ready);",
     "sim: stores after one forward pass wait for it on every stream they land on"),
    ("compute-switch-forgets-old-stream", "src/transfer/cuda/cuda_backend_impl.hpp",
     "        switched_from.push_back(ev);\n", "",
     "sim: after a compute stream switch, jobs still wait for the old stream's work"),
    ("poll-without-device-scope", "src/transfer/cuda/cuda_backend.cpp",
     "    scope.emplace(*s.rt, s.config.device);\n  } catch (const cuda_error& e) {\n"
     "    // Never report",
     "  } catch (const cuda_error& e) {\n    // Never report",
     "sim: a backend on device 1 used from a thread with no context creates none on 0"),
    ("staging-sized-by-total-bytes", "src/transfer/cuda/cuda_backend.cpp",
     "j.staging = s.staging_ring.allocate(j.staging_bytes);",
     "j.staging_bytes = j.plan.total_bytes;\n      j.staging = s.staging_ring.allocate(j.staging_bytes);",
     "sim: staged jobs of odd-sized pieces keep to their own staging"),
    ("compute-stream-any-device", "src/transfer/cuda/cuda_backend_impl.hpp",
     "KVOFFLOAD_EXPECTS(device == config.device,", "KVOFFLOAD_EXPECTS(true || device == config.device,",
     "sim: compute streams of another device are refused, once and clearly"),
    # Issue 49, item 9: a deferred store's compute wait is taken when it is submitted.
    ("deferred-store-waits-at-start", "src/transfer/transfer_engine.cpp",
     "    deferred_.back().mark = backend_->mark_compute();\n", "",
     "sim: a deferred store does not wait for engine work queued after its submission"),
    ("backend-ignores-mark", "src/transfer/cuda/cuda_backend_impl.hpp",
     "    if (mark) {\n      // The wait takes", "    if (mark && false) {\n      // The wait takes",
     "sim: a deferred store does not wait for engine work queued after its submission"),
    ("mark-forgets-switched-streams", "src/transfer/cuda/cuda_backend_impl.hpp",
     "    if (switched_from.empty()) {\n      e = rt->event_record(ev, *compute);",
     "    if (true) {\n      e = rt->event_record(ev, *compute);",
     "sim: a deferred store submitted after a stream switch waits for both passes"),
    ("shed-store-keeps-mark", "src/transfer/transfer_engine.cpp",
     "  if (shed_over_bound(job, bytes)) {\n    backend_->drop_mark(mark);",
     "  if (shed_over_bound(job, bytes)) {",
     "sim: marks of deferred stores that never start are given back"),
    # Issue 49, items 3 and 9: graph captures, tensors on another device, duplicate blocks.
    ("capture-not-checked", "src/transfer/cuda/cuda_backend.cpp",
     "    if (!s.capture_free(j, must_wait, mark.ev)) {",
     "    if (false && !s.capture_free(j, must_wait, mark.ev)) {",
     "sim: a job submitted while the compute stream captures a graph is refused"),
    ("switch-records-capturing-stream", "src/transfer/cuda/cuda_backend_impl.hpp",
     "capturing(*compute) ? dev::invalid_value : rt->event_record(ev, *compute)",
     "rt->event_record(ev, *compute)",
     "sim: switching away from a capturing compute stream joins no capture"),
    ("worker-skips-tensor-check", "src/transfer/worker.cpp",
     "    cuda->check_tensors(c.tensors);\n", "    (void)cuda;\n",
     "sim: KV tensors that are not the backend device's memory are refused by name"),
    ("spare-event-zero", "src/transfer/cuda/cuda_backend_impl.hpp",
     "    if (!ev || *ev == 0) return;  // 0 is no event: never a spare", "    if (!ev) return;",
     "sim: a store marked during a capture and dropped leaves marking intact"),
    ("poll-fails-on-capture", "src/transfer/cuda/cuda_backend.cpp",
     "        if (dev::capture_status(e)) {    // a capture elsewhere forbids the query: ask later",
     "        if (false) {",
     "sim: a capture elsewhere refusing queries delays results, never fails them"),
    ("planner-allows-duplicates", "src/transfer/copy_planner.cpp",
     "  check_duplicates(job, kind);\n", "",
     "Planner refuses a job that writes one block twice"),
    # Issue 49, item 7: the staged path's DMAs per host run.
    ("staged-runs-cross-seams", "src/transfer/cuda/cuda_backend_impl.hpp",
     "if (last.host + last.bytes == h && registration(last.host) == registration(h)) {",
     "(void)registration;\n        if (last.host + last.bytes == h) {",
     "sim: jobs across the pool's registration seams run in every copy mode"),
    ("staged-load-scatters-before-dma", "src/transfer/cuda/cuda_backend_impl.hpp",
     "if (staged && !store) e = copy_runs(job, stream);  // the host runs in first",
     "if (false) e = copy_runs(job, stream);",
     "sim: every copy mode round-trips random jobs byte-exactly"),
    ("submit-without-profiler-range", "src/transfer/cuda/cuda_backend.cpp",
     "  const detail::Range range(*s.rt,\n", "  const std::string range(\n",
     "sim: every submission is a profiler range named by its job"),
    # Issue 49, item 10: the kernel body's invariants (CPU tests of the code the kernels run).
    ("vector-path-misaligned", "include/kvoffload/detail/copy_body.hpp",
     "  if (((p.src ^ p.dst) & 15U) == 0) {", "  if ((p.src & 15U) == 0) {",
     "Kernel body: every 16-byte word is aligned on both sides"),
    ("builder-no-group-clamp", "include/kvoffload/detail/copy_body.hpp",
     "  if (within >= L.expected[g]) return DevicePiece{0, 0, 0};\n", "",
     "build_piece emits no bytes for a failed check, past the count or past the tensors"),
    ("one-link-for-both-directions", "src/testing/sim_device/sim_device_state.hpp",
     "    return {seconds, to_host > to_device ? 1 : 0};", "    return {seconds, 0};",
     "sim: with a link per direction, a store and a load overlap"),
    ("calibrate-ignores-staged", "src/transfer/cuda/copy_mode.cpp",
     "        staged_wins += staged && m.staged_s < m.kernel_s ? 1 : 0;", "",
     "calibrate's choice follows the measurements"),
]


def build():
    if not os.path.exists(os.path.join(BUILD, "build.ninja")):
        subprocess.run(["cmake", "--preset", "debug", "-B", BUILD], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
    r = subprocess.run(["cmake", "--build", BUILD, "--target", "kvoffload_tests"],
                       cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return r.returncode == 0, r.stdout[-3000:]


def run_test(name):
    spec = "".join("\\" + c if c in "[],\\*~" else c for c in name)
    r = subprocess.run([TESTS, spec], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=300,
                       env=dict(os.environ, KVOFFLOAD_LOG_LEVEL="error"))
    return r.returncode, r.stdout


def main(names):
    os.environ["PATH"] = "/usr/local/cuda/bin:" + os.environ.get("PATH", "")
    chosen = [m for m in MUTATIONS if not names or m[0] in names]
    ok, log = build()  # unmutated: every chosen test must pass first
    if not ok:
        print(log)
        return 1
    for test in sorted({m[4] for m in chosen}):
        rc, out = run_test(test)
        if rc != 0:
            print(f"unmutated, this test fails already: {test}\n{out[-2000:]}")
            return 1
    results = []
    for name, path, find, replace, test in chosen:
        full = os.path.join(ROOT, path)
        with open(full) as f:
            original = f.read()
        if original.count(find) != 1:
            results.append((name, "NOT APPLIED (text not found once)", test))
            print(f"{name:32s} NOT APPLIED: its text is not in {path} once", flush=True)
            continue
        try:
            with open(full, "w") as f:
                f.write(original.replace(find, replace))
            ok, log = build()
            if not ok:
                results.append((name, "BUILD FAILED", test))
                print(log)
                continue
            rc, out = run_test(test)
            if "No test cases matched" in out:
                results.append((name, "NO SUCH TEST", test))
            else:
                results.append((name, "caught" if rc != 0 else "MISSED", test))
        finally:
            with open(full, "w") as f:
                f.write(original)
        print(f"{results[-1][0]:32s} {results[-1][1]:8s} {test}", flush=True)
    build()
    missed = [r for r in results if r[1] != "caught"]
    print(f"{len(results) - len(missed)}/{len(results)} mutations caught")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
