"""VllmBridge (python/src/vllm_binding.cpp): the vLLM connector's scheduler-side loops in C++.

Twin schedulers get the same random decode-heavy trace, one through the bridge (reading
vLLM-shaped objects, leaving idle requests out of steps) and one through the plain API with
every request every step; their jobs must be the same at every step. vLLM itself is not
needed: the objects are stand-ins with vLLM's attribute names."""

import hashlib
import os
import random
import types
import warnings

import pytest

import kvoffload as kv
from kvoffload import _kvoffload
from kvoffload.vllm import event_groups

from conftest import block_hashes

ns = types.SimpleNamespace
BLOCK = 16


def jobs_of(step):
    loads, stores, flush, tier_jobs = step
    return ([(j.request_id, list(j.gpu_block_ids), list(j.host_block_ids), j.keys)
             for j in loads],
            [(j.request_id, list(j.gpu_block_ids), list(j.host_block_ids), j.keys)
             for j in stores], list(flush))


class Twin:
    """A request as vLLM holds it (for the bridge) and as the plain API is told."""

    def __init__(self, rid, prompt_tokens, prefix):
        self.request = ns(request_id=rid, block_hashes=[], num_tokens=prompt_tokens,
                          kv_transfer_params=None)
        self.prefix = prefix
        self.blocks = []  # GPU block ids
        self.computed = 0
        self.prompt = prompt_tokens
        self.hash()

    def chunk(self, rng, factor):
        """The next prefill chunk: often ending on a host block's boundary, where a store is
        due with nothing else new (no hash, no block) to show it."""
        left = self.prompt - self.computed
        step = rng.choice([BLOCK * factor, 2 * BLOCK * factor, 7, 23, left])
        return max(1, min(left, step))

    def hash(self):
        n = self.request.num_tokens // BLOCK
        self.request.block_hashes.extend(block_hashes(self.prefix, n)[len(self.request.block_hashes):])


@pytest.mark.parametrize("factor", [1, 2, 4])
def test_bridge_steps_match_the_plain_api_with_idle_requests_left_out(factor):
    seed = int(os.environ.get("KVOFFLOAD_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} factor {factor}")
    rng = random.Random(seed)
    config = kv.SchedulerConfig(groups=[kv.GroupConfig("full_attention", BLOCK)],
                                host_blocks=64, block_size_factor=factor)
    plain, bridged = kv.Scheduler(config), kv.Scheduler(config)
    bridge = _kvoffload.VllmBridge(bridged._s, [BLOCK])
    running, next_block, made = {}, 1, 0
    for step in range(120):
        new_reqs, cached = [], ns(req_ids=[], num_computed_tokens=[], new_block_ids=[],
                                  resumed_req_ids=set())
        scheduled, entries = {}, []
        # Arrivals share a few prefixes, so later ones hit what earlier ones stored.
        while len(running) < 6 and made < 40:
            t = Twin(f"r{made}", rng.randrange(20, 200), f"p{rng.randrange(3)}")
            made += 1
            plain.update_request(t.request.request_id, t.request.num_tokens,
                                 list(t.request.block_hashes))
            a = plain.lookup(t.request.request_id, 0)
            b = bridge.lookup(t.request, 0)
            assert a == b, f"seed {seed} step {step}: lookup {a} vs {b}"
            if rng.random() < 0.3:  # vLLM's max_offload_tokens: the window must know it
                cap = rng.randrange(0, 200)
                plain.limit_stores(t.request.request_id, cap)
                bridged.limit_stores(t.request.request_id, cap)
            hit = a or 0
            need = -(-t.request.num_tokens // BLOCK)
            t.blocks = list(range(next_block, next_block + need))
            next_block += need
            plain.on_allocated(t.request.request_id, [kv.AllocatedGroup(t.blocks, 0)], hit)
            bridge.allocated(t.request.request_id, ns(blocks=(
                [ns(block_id=b, is_null=False, block_hash=None) for b in t.blocks],)), hit)
            t.computed = hit
            n = t.chunk(rng, factor)
            scheduled[t.request.request_id] = n
            new_reqs.append(ns(req_id=t.request.request_id, num_computed_tokens=hit,
                               block_ids=(list(t.blocks),)))
            entries.append(kv.ScheduledRequest(t.request.request_id, hit, n, [list(t.blocks)]))
            running[t.request.request_id] = t
        for rid, t in list(running.items()):
            if any(e.request_id == rid for e in entries):
                continue
            # The rest of the prompt in chunks (its blocks were all allocated at admission,
            # so no new block comes with them), then decode: one token, and a new GPU block
            # when the last one is full.
            n = t.chunk(rng, factor) if t.computed < t.prompt else 1
            fresh = None
            if t.computed + n > len(t.blocks) * BLOCK:
                fresh = ([next_block],)
                t.blocks.append(next_block)
                next_block += 1
            cached.req_ids.append(rid)
            cached.num_computed_tokens.append(t.computed)
            cached.new_block_ids.append(fresh)
            scheduled[rid] = n
            entries.append(kv.ScheduledRequest(rid, t.computed, n,
                                               [list(fresh[0])] if fresh else [[]]))
        out = ns(scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached,
                 num_scheduled_tokens=scheduled, preempted_req_ids=set())
        p = plain.build_step(entries)
        b = bridge.build_step(out)
        assert jobs_of((p.load_jobs, p.store_jobs, p.flush, p.tier_jobs)) == jobs_of(b), \
            f"seed {seed} step {step}"
        for sched, jobs in ((plain, p.load_jobs + p.store_jobs), (bridged, b[0] + b[1])):
            sched.on_completed([kv.JobReport(j.id) for j in jobs])
        # The model ran: every scheduled token computed, one output token each.
        for rid, n in scheduled.items():
            t = running[rid]
            t.computed += n
            if t.computed >= t.prompt:  # a token sampled
                t.request.num_tokens = t.computed + 1
                t.hash()
        for rid, t in list(running.items()):
            # The plain API is told every hash every step (update_request takes the full list).
            plain.update_request(rid, t.request.num_tokens, list(t.request.block_hashes))
            if t.request.num_tokens > 260 or rng.random() < 0.02:
                plain.on_finished(rid)
                assert bridge.finished(rid)
                del running[rid]
    passed, skipped = bridge.counts
    assert skipped > passed, (passed, skipped)  # a decode step leaves most requests out
    assert plain.stats()["blocks_stored"] == bridged.stats()["blocks_stored"] > 0
    assert plain.stats()["hits"] == bridged.stats()["hits"] > 0
    assert len(bridge) == len(running)


def test_bridge_events_are_the_python_reference():
    config = kv.SchedulerConfig(groups=[kv.GroupConfig("full_attention", BLOCK)],
                                host_blocks=4)
    a, b = kv.Scheduler(config), kv.Scheduler(config)
    bridge = _kvoffload.VllmBridge(b._s, [BLOCK])
    for s in (a, b):  # 6 blocks through a 4-block cache: stores, then evictions
        for r in range(3):
            h = block_hashes(f"ev{r}", 2)
            s.update_request(f"r{r}", 32, h)
            s.lookup(f"r{r}", 0)
            s.on_allocated(f"r{r}", [kv.AllocatedGroup([])], 0)
            step = s.build_step([kv.ScheduledRequest(f"r{r}", 0, 32, [[2 * r + 1, 2 * r + 2]])])
            s.on_completed([kv.JobReport(j.id) for j in step.store_jobs])
            s.on_finished(f"r{r}")
    want = event_groups(a.take_events(), a.partly_written)
    got = [tuple(e) for e in bridge.events()]
    assert got == [(r, m, g, list(h)) for r, m, g, h in want]
    assert {e[0] for e in got} == {False, True}  # stores and evictions both seen
    assert bridge.events() == []


def test_bridge_names_bad_input():
    s = kv.Scheduler(kv.SchedulerConfig(groups=[kv.GroupConfig("full_attention", BLOCK)],
                                        host_blocks=4))
    bridge = _kvoffload.VllmBridge(s._s, [BLOCK])
    req = ns(request_id="bad", block_hashes=[b""], num_tokens=16)
    with pytest.raises(kv.InvalidArgument, match='request "bad": block hash 0 has 0 bytes'):
        bridge.lookup(req, 0)
    out = ns(scheduled_new_reqs=[], preempted_req_ids=None, num_scheduled_tokens={},
             scheduled_cached_reqs=ns(req_ids=["x"], num_computed_tokens=[0],
                                      new_block_ids=[None], resumed_req_ids=set()))
    with pytest.raises(kv.InvalidArgument, match='request "x": not in num_scheduled_tokens'):
        bridge.build_step(out)
    out.scheduled_cached_reqs.num_computed_tokens = []
    with pytest.raises(kv.InvalidArgument, match="columns of different lengths"):
        bridge.build_step(out)


def session_rehash(req, tokens):
    """vLLM's chained block hashes of the whole blocks of `tokens`, extending req's."""
    h = req.block_hashes
    while (len(h) + 1) * BLOCK <= len(tokens):
        i = len(h)
        h.append(hashlib.sha256((h[-1] if h else b"") +
                                repr(tokens[i * BLOCK:(i + 1) * BLOCK]).encode()).digest()[:16])
    req.num_tokens = len(tokens)


def session_step(bridge, rid, computed, blocks, n):
    """A step scheduling `rid` as vLLM schedules a waiting request: in scheduled_new_reqs with
    its whole block table."""
    return bridge.build_step(ns(
        scheduled_new_reqs=[ns(req_id=rid, num_computed_tokens=computed, block_ids=(blocks,))],
        num_scheduled_tokens={rid: n}, preempted_req_ids=set(),
        scheduled_cached_reqs=ns(req_ids=[], num_computed_tokens=[], new_block_ids=[],
                                 resumed_req_ids=set())))


def blocks_of(ids):
    return ns(blocks=([ns(block_id=b, is_null=False, block_hash=None) for b in ids],))


def test_a_resumable_session_turn_stores_from_its_whole_block_table():
    """vLLM's streaming sessions: a stopped turn keeps the request; the next chunk comes back
    as a waiting request scheduled in scheduled_new_reqs with all its blocks and no lookup.
    Appending that table to the first turn's would store other GPU blocks' bytes."""
    s = kv.Scheduler(kv.SchedulerConfig(groups=[kv.GroupConfig("full_attention", BLOCK)],
                                        host_blocks=64))
    bridge = _kvoffload.VllmBridge(s._s, [BLOCK])
    tokens = list(range(100, 148))  # turn 1: 48 tokens, 3 whole blocks
    req = ns(request_id="sess", block_hashes=[], num_tokens=0, kv_transfer_params=None)
    session_rehash(req, tokens)
    assert bridge.lookup(req, 0) == 0
    bridge.allocated("sess", blocks_of([1, 2, 3, 4]), 0)
    _, stores, _, _ = session_step(bridge, "sess", 0, [1, 2, 3, 4], 48)
    assert [list(map(int, j.gpu_block_ids)) for j in stores] == [[1, 2, 3]]
    tokens += list(range(500, 540))  # turn 2: 40 more prompt tokens, GPU blocks 5 and 6
    session_rehash(req, tokens)
    bridge.allocated("sess", blocks_of([1, 2, 3, 4, 5, 6]), 0)
    _, stores, _, _ = session_step(bridge, "sess", 48, [1, 2, 3, 4, 5, 6], 40)
    # Offloaded blocks 3 and 4 (tokens 48-79) are in GPU blocks 4 and 5, under their hashes.
    assert [list(map(int, j.gpu_block_ids)) for j in stores] == [[4, 5]]
    assert [k[0] for k in stores[0].keys] == req.block_hashes[3:5]


def test_hashes_that_stop_extending_what_was_given_stop_stores_and_loads():
    """The next turn of a session whose turn ended inside a block: vLLM drops the hashes past
    the kept tokens and derives them again from other tokens. The scheduler's old hash for
    that block would name the new tokens' KV: nothing past the shared hashes is stored, and
    the request loads nothing more."""
    s = kv.Scheduler(kv.SchedulerConfig(groups=[kv.GroupConfig("full_attention", BLOCK)],
                                        host_blocks=64))
    bridge = _kvoffload.VllmBridge(s._s, [BLOCK])
    tokens = list(range(100, 163))  # 63 prompt tokens
    req = ns(request_id="s2", block_hashes=[], num_tokens=0, kv_transfer_params=None)
    session_rehash(req, tokens)
    assert bridge.lookup(req, 0) == 0
    bridge.allocated("s2", blocks_of([1, 2, 3, 4]), 0)
    _, first, _, _ = session_step(bridge, "s2", 0, [1, 2, 3, 4], 63)
    s.on_completed([kv.JobReport(j.id) for j in first])
    tokens.append(777)  # a sampled token completes block 3's hash, then the turn stops
    session_rehash(req, tokens)
    old = req.block_hashes[3]
    assert bridge.lookup(req, 63) == 0  # the scheduler now has hash 3 too
    del tokens[63:]
    del req.block_hashes[63 // BLOCK:]
    tokens += list(range(600, 650))
    session_rehash(req, tokens)
    assert req.block_hashes[3] != old
    bridge.allocated("s2", blocks_of(range(1, 9)), 0)
    with pytest.warns(RuntimeWarning, match='"s2": its block hashes changed'):
        _, stores, _, _ = session_step(bridge, "s2", 63, list(range(1, 9)), 50)
    assert stores == []  # blocks 0-2 were stored in turn 1; nothing past 48 tokens now
    assert bridge.lookup(req, 48) == 0
    # What turn 1 stored is still right: a new request with its prompt hits it.
    other = ns(request_id="o", block_hashes=list(req.block_hashes[:3]), num_tokens=49,
               kv_transfer_params=None)
    assert bridge.lookup(other, 0) == 48


def cached_step(bridge, rid, computed, n):
    """A step scheduling running request `rid` (vLLM's scheduled_cached_reqs), no new block."""
    return bridge.build_step(ns(
        scheduled_new_reqs=[], num_scheduled_tokens={rid: n}, preempted_req_ids=set(),
        scheduled_cached_reqs=ns(req_ids=[rid], num_computed_tokens=[computed],
                                 new_block_ids=[None], resumed_req_ids=set())))


def test_a_running_requests_last_hash_replaced_in_place_is_seen():
    """A step reads a running request's hashes by the list's length and its last given hash
    object: a hash replaced by another of other bytes at the same length (no new hash) must
    still be seen as diverged; one replaced by an equal copy is no change."""
    s = kv.Scheduler(kv.SchedulerConfig(groups=[kv.GroupConfig("full_attention", BLOCK)],
                                        host_blocks=64))
    bridge = _kvoffload.VllmBridge(s._s, [BLOCK])
    tokens = list(range(100, 100 + 3 * BLOCK))
    req = ns(request_id="r", block_hashes=[], num_tokens=0, kv_transfer_params=None)
    session_rehash(req, tokens)
    assert bridge.lookup(req, 0) == 0
    bridge.allocated("r", blocks_of([1, 2, 3, 4]), 0)
    _, stores, _, _ = session_step(bridge, "r", 0, [1, 2, 3, 4], 3 * BLOCK - 1)
    s.on_completed([kv.JobReport(j.id) for j in stores])
    req.block_hashes[-1] = bytes(bytearray(req.block_hashes[-1]))  # equal bytes, new object
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cached_step(bridge, "r", 3 * BLOCK - 1, 1)
    req.block_hashes[-1] = hashlib.sha256(b"other tokens").digest()[:16]
    with pytest.warns(RuntimeWarning, match='"r": its block hashes changed'):
        _, stores, _, _ = cached_step(bridge, "r", 3 * BLOCK, 1)
    assert all(k[0] != req.block_hashes[-1] for j in stores for k in j.keys)


def session_start(rid, prompt, guard):
    """A scheduler, a bridge (stale_session_hashes `guard`) and a resumable request of
    `prompt`, looked up and allocated one GPU block per started block."""
    s = kv.Scheduler(kv.SchedulerConfig(groups=[kv.GroupConfig("full_attention", BLOCK)],
                                        host_blocks=64))
    bridge = _kvoffload.VllmBridge(s._s, [BLOCK], guard)
    req = ns(request_id=rid, block_hashes=[], num_tokens=0, kv_transfer_params=None,
             resumable=True)
    session_rehash(req, prompt)
    assert bridge.lookup(req, 0) == 0
    blocks = list(range(1, (len(prompt) + BLOCK - 1) // BLOCK + 2))
    bridge.allocated(rid, blocks_of(blocks), 0)
    return s, bridge, req, blocks


@pytest.mark.parametrize("guard", [False, True])
def test_a_session_turn_under_vllm_0_21_never_stores_under_the_dropped_tokens_hash(guard):
    """vLLM 0.21 starts a streaming session's next turn by dropping the sampled token past the
    computed ones but keeps the block hash computed over it, and chains the next turn's
    hashes from it. Block 3's hash then names a token the request no longer has: with the
    bridge told so (stale_session_hashes), nothing from block 3 on is stored or loaded; told
    nothing (vLLM 0.32+, which drops those hashes), the stale key is stored: what the guard
    prevents."""
    tokens = list(range(100, 163))  # 63 prompt tokens
    s, bridge, req, blocks = session_start("t", tokens, guard)
    _, first, _, _ = session_step(bridge, "t", 0, blocks, 63)
    s.on_completed([kv.JobReport(j.id) for j in first])
    # A lookup after it was scheduled (a preemption's) is not a new turn: nothing is limited.
    assert bridge.lookup(req, 0) == 48
    tokens.append(777)  # the turn's last sampled token completes block 3: its hash appears
    session_rehash(req, tokens)
    stale = req.block_hashes[3]
    del tokens[63:]  # vLLM 0.21: the sampled token is dropped, block_hashes is not cut
    tokens += list(range(600, 650))
    session_rehash(req, tokens)  # hashes 4.. chain from the stale hash 3
    assert req.block_hashes[3] == stale
    bridge.allocated("t", blocks_of(range(1, 9)), 0)
    if guard:
        with pytest.warns(RuntimeWarning, match='"t": its block hashes changed'):
            _, stores, _, _ = session_step(bridge, "t", 63, list(range(1, 9)), 50)
    else:
        _, stores, _, _ = session_step(bridge, "t", 63, list(range(1, 9)), 50)
    stored = {bytes(h) for j in stores for h, _ in j.keys}
    assert (stale in stored) == (not guard)
    if guard:
        assert stored == set()  # nothing past block 2 (blocks 0-2 were stored in turn 1)
        assert bridge.lookup(req, 48) == 0


def test_a_session_turn_after_rejected_drafts_is_caught_too():
    """Speculative decoding under vLLM 0.21: the last step scheduled 14..16 (end 17), both
    drafts were rejected, so vLLM computed 15 tokens and the bonus token at 15 completed
    block 0; the next turn drops it and keeps block 0's hash. The boundary (16) lies between
    the new turn's computed tokens and the last end: nothing is stored from block 0 on."""
    tokens = list(range(100, 114))  # 14 prompt tokens
    _, bridge, req, blocks = session_start("d", tokens, True)
    session_step(bridge, "d", 0, blocks, 14)
    tokens.append(500)  # sampled at 14
    session_rehash(req, tokens)
    cached_step(bridge, "d", 14, 3)  # 14 and two drafts: end 17
    tokens.append(501)  # drafts rejected; the bonus token at 15 completes block 0
    session_rehash(req, tokens)
    stale = req.block_hashes[0]
    del tokens[15:]  # the next turn drops the token past the 15 computed ones
    tokens += list(range(700, 740))
    session_rehash(req, tokens)
    assert req.block_hashes[0] == stale
    bridge.allocated("d", blocks_of(range(1, 5)), 0)
    with pytest.warns(RuntimeWarning, match='"d": its block hashes changed'):
        _, stores, _, _ = session_step(bridge, "d", 15, list(range(1, 5)), 40)
    assert stores == []


def test_stale_session_hashes_follow_the_vllm_version():
    from kvoffload.vllm import stale_session_hashes

    assert stale_session_hashes("0.21.0") and stale_session_hashes("0.21.1.dev3+gabc")
    assert not stale_session_hashes("0.32.0+cpu") and not stale_session_hashes("0.33.0")
    assert not stale_session_hashes("1.0.0")
    assert stale_session_hashes("")  # unknown: the safe side


@pytest.mark.parametrize("preempted", [False, True])
def test_mamba_states_are_stored_only_within_vllms_prefill(preempted):
    """Issue 47 (docs/semantics.md 6.10): the bridge gives each looked-up request's final
    tokens, vLLM's prefill end max(num_prompt_tokens, num_tokens - 1). A 100-token prompt:
    the mamba block ending at 128, completed by decode steps, is not stored. The same request
    looked up again after a preemption with 140 tokens recomputes 139 as a prefill: the block
    ending at 128 is a prefill state then, and stored."""
    s = kv.Scheduler(kv.SchedulerConfig(groups=[kv.GroupConfig("mamba", 32)],
                                        hash_block_size=32, host_blocks=64))
    bridge = _kvoffload.VllmBridge(s._s, [32])
    tokens = list(range(3, 103)) + (list(range(200, 240)) if preempted else [])
    req = ns(request_id="m", block_hashes=[], num_tokens=0, kv_transfer_params=None,
             num_prompt_tokens=100)
    req_hashes = []
    for i in range(len(tokens) // 32):
        req_hashes.append(hashlib.sha256(repr(tokens[:(i + 1) * 32]).encode()).digest()[:16])
    req.block_hashes, req.num_tokens = list(req_hashes[:3]), 100
    if preempted:
        req.block_hashes, req.num_tokens = list(req_hashes), 140
    assert bridge.lookup(req, 0) == 0
    bridge.allocated("m", ns(blocks=([],)), 0)
    # Prefill as align mode chunks it: 0-96 (the state in block 2), then the rest of what vLLM
    # computes as a prefill (to 100, or to 139 after the preemption: states at 128 and 139).
    first = session_step(bridge, "m", 0, [0, 0, 7], 96)
    assert [list(map(int, j.gpu_block_ids)) for j in first[1]] == [[7]]
    if preempted:
        _, stores, _, _ = bridge.build_step(ns(
            scheduled_new_reqs=[], num_scheduled_tokens={"m": 43}, preempted_req_ids=set(),
            scheduled_cached_reqs=ns(req_ids=["m"], num_computed_tokens=[96],
                                     new_block_ids=[([8, 9],)], resumed_req_ids=set())))
        assert [list(map(int, j.gpu_block_ids)) for j in stores] == [[8]]
        assert s.stats()["unfinal_state_skips"] == 0
        return
    bridge.build_step(ns(
        scheduled_new_reqs=[], num_scheduled_tokens={"m": 4}, preempted_req_ids=set(),
        scheduled_cached_reqs=ns(req_ids=["m"], num_computed_tokens=[96],
                                 new_block_ids=[([8],)], resumed_req_ids=set())))
    # Decode: 100 -> 128 one token a step; block 3 (GPU block 8) completes at 128.
    stored = []
    for computed in range(100, 128):
        if computed + 1 == 128:
            req.block_hashes.append(req_hashes[3] if len(req_hashes) > 3 else
                                    hashlib.sha256(b"decode").digest()[:16])
        req.num_tokens = computed + 1
        _, stores, _, _ = cached_step(bridge, "m", computed, 1)
        stored += [list(map(int, j.gpu_block_ids)) for j in stores]
    assert stored == []
    assert s.stats()["unfinal_state_skips"] == 1


def test_kvoffload_continues_reaches_policy_reuse():
    # kv_transfer_params {"kvoffload_continues": bool} -> the bridge's lookup -> the hint.
    # Four host blocks: "a" (continues) then "b" (ends) fill them, "c" needs two: policy reuse
    # gives up b's; with the hints swapped (the control), a's.
    from kvoffload.vllm.config import continues_param
    assert continues_param({"kvoffload_continues": True}) == 1
    assert continues_param({"kvoffload_continues": False}) == 0
    assert continues_param({"kvoffload_continues": 1}) == -1  # not a bool: ignored
    assert continues_param(None) == -1 and continues_param({}) == -1

    def run(hints):
        s = kv.Scheduler(kv.SchedulerConfig(groups=[kv.GroupConfig("full_attention", BLOCK)],
                                            host_blocks=4), policy="reuse")
        bridge = _kvoffload.VllmBridge(s._s, [BLOCK])
        for k, (rid, when) in enumerate((("a", 1.0), ("b", 2.0), ("c", 3.0))):
            s.set_time(when)
            req = ns(request_id=rid, block_hashes=block_hashes(rid, 2), num_tokens=2 * BLOCK,
                     kv_transfer_params=None)
            assert bridge.lookup(req, 0, -1, -1, hints.get(rid, -1)) == 0
            s.on_allocated(rid, [kv.AllocatedGroup([])], 0)
            step = s.build_step([kv.ScheduledRequest(rid, 0, 2 * BLOCK,
                                                     [[2 * k + 1, 2 * k + 2]])])
            s.on_completed([kv.JobReport(j.id) for j in step.store_jobs])
            s.on_finished(rid)
        found = {}
        for rid in ("a", "b"):
            s.update_request(rid + "2", 2 * BLOCK, block_hashes(rid, 2))
            found[rid] = s.lookup(rid + "2", 0)
        return found

    assert run({"a": 1, "b": 0}) == {"a": 2 * BLOCK, "b": 0}
    assert run({"a": 0, "b": 1}) == {"a": 0, "b": 2 * BLOCK}
