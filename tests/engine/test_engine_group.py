#!/usr/bin/python3
"""test_engine_group.py - the scheduler and executor as real processes, in a real group
(prefetcher, executor, scheduler, router under `strata up`) on the demo model (random weights).

Cases:
  batching        32 concurrent clients, each its own DEALER, prompts of 3..60 tokens, answers of
                  8..48 tokens (greedy, and 8 of them seeded top-k/top-p sampling), twice: with
                  room for all of them in one step, and with a token budget of 48 per step (so
                  prefill is chunked) and a KV cache too small for all of them at once (so
                  sequences are preempted and recomputed). Every client receives its full
                  streamed answer (contiguous indices, one done), and every answer equals the
                  single-process `strata generate` for the same prompt and sampling flags. The
                  scheduler's counters show that steps held many sequences of different lengths
                  and mixed prefill chunks with decode tokens.
  executor_crash  16 clients stream 200-token answers; once the scheduler has applied a few
                  tokens of each (the executor is paced with SIGSTOP/SIGCONT so that the moment
                  does not depend on how late client threads see their tokens), the executor
                  gets kill -9. The launcher restarts it (from the weight arena), the
                  scheduler replays, and every request completes with exactly the tokens
                  `strata generate` gives (the answer it would have had without the crash); at
                  the moment of the kill no request had finished.
  scheduler_crash 8 clients stream 300-token answers; the scheduler gets kill -9 once it has
                  applied a few tokens of each (paced the same way). The launcher restarts it,
                  the new scheduler gets the live requests (the router resubmits them, or ZeroMQ
                  delivers submits the old one had not read), and every client gets exactly the
                  answer of `strata generate`, each token once.
  q8              [executor] cpu_act = q8 on an int4 pack of the demo model: 8 clients (greedy and
                  sampled) get exactly `strata generate --cpu-act q8`; the executor reports the mode.
  eos_set         a copy of the packed demo model whose generation_config.json lists several eos
                  ids (an id it never produces, then a token its greedy answer reaches, as
                  gpt-oss's list does): through the group (the executor builds the model over
                  the arena, its hello carries the set, the scheduler finishes on it) the greedy
                  answer stops right after that token with `stop` and without its text; sampled
                  answers equal `strata generate` on the copy; ignore_eos ignores every id.

usage: test_engine_group.py --strata BIN --prefetcher BIN --executor BIN --scheduler BIN
                            --router BIN --client-py DIR CASE...
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "group"))
import grouplib as gl  # noqa: E402

A = None


def reference(r, model=None, extra=()):
    """Token ids of the single-process `strata generate` for request dict r on the packed demo
    model (or model)."""
    cmd = [A.strata, "generate", model or A.model, "--tokens", ",".join(map(str, r["prompt"])), "--max-tokens",
           str(r["max_tokens"]), "--threads", "1"] + list(extra)
    if r.get("ignore_eos"):
        cmd.append("--ignore-eos")
    if r.get("temperature", 0.0) > 0:
        cmd += ["--temperature", repr(r["temperature"]), "--top-k", str(r.get("top_k", 0)), "--top-p",
                repr(r.get("top_p", 1.0)), "--seed", str(r.get("seed", 0))]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, (cmd, out.stderr)
    return [int(x) for x in out.stdout.split()]


def long_reqs(rnd, prompt_lens, max_tokens, **sampling):
    """Requests of random prompts of these lengths, each max_tokens long (EOS ignored); every
    second one sampled with these settings and a random seed, the others greedy."""
    reqs = []
    for i, n in enumerate(prompt_lens):
        r = {"prompt": [rnd.randrange(0, 286) for _ in range(n)], "max_tokens": max_tokens, "ignore_eos": True}
        if i % 2:
            r.update(sampling, seed=rnd.randrange(1 << 63))
        reqs.append(r)
    return reqs


def stream_all(g, reqs):
    """Run every request dict from its own client thread, all released at once. Each thread
    checks that token indices are contiguous. Returns the results: (tokens, done) or an exception."""
    from strata_client import StrataClient
    res = [None] * len(reqs)
    go = threading.Barrier(len(reqs))

    def run(i, r):
        try:
            with StrataClient("tcp://127.0.0.1:%d" % g.port, timeout=90.0, resume_after=30.0) as c:
                toks = []
                go.wait(30)
                kw = dict(r)
                for ev in c.generate(tokens=kw.pop("prompt"), **kw):
                    assert ev["index"] == len(toks), "index %d after %d tokens" % (ev["index"], len(toks))
                    toks.extend(ev["tokens"])
                d = c.last_done
                assert d is not None and d["type"] == "done", d
                assert d["usage"]["completion_tokens"] == len(toks), (d, len(toks))
                res[i] = (toks, d)
        except Exception as e:  # noqa: BLE001 - reported per request below
            res[i] = e

    th = [threading.Thread(target=run, args=(i, r)) for i, r in enumerate(reqs)]
    for t in th:
        t.start()
    for t in th:
        t.join(180)
    assert not any(t.is_alive() for t in th), "a client thread hung"
    return res


def sched_stats(g):
    from strata_client import StrataClient
    with StrataClient("tcp://127.0.0.1:%d" % g.port, timeout=10.0) as c:
        return c.stats()


def check_answers(reqs, res, refs):
    bad = []
    for i, (r, got, ref) in enumerate(zip(reqs, res, refs)):
        if isinstance(got, Exception):
            bad.append("request %d: %r" % (i, got))
        elif got[0] != ref:
            n = next((k for k in range(min(len(got[0]), len(ref))) if got[0][k] != ref[k]), min(len(got[0]), len(ref)))
            bad.append("request %d (prompt %d tokens, temperature %s): %d tokens vs %d of strata generate, first difference at %d"
                       % (i, len(r["prompt"]), r.get("temperature", 0), len(got[0]), len(ref), n))
    assert not bad, "\n".join(bad)


def pulse_until(g, pid, pred, step_s=None, limit=20.0):
    """With pid stopped (SIGSTOP), look at the scheduler's stats until pred(stats) holds, letting
    pid run step_s at a time between looks (None: not at all); pid is left stopped. Returns those
    stats. Progress between two looks is bounded by how long pid ran, not by how late a client
    thread sees its tokens."""
    t0 = time.time()
    while time.time() - t0 < limit:
        st = sched_stats(g)
        if pred(st):
            return st
        if step_s is None:
            time.sleep(0.02)
            continue
        # from a shell: this process's own client threads would hold the GIL past step_s
        subprocess.run(["sh", "-c", "kill -CONT %d; sleep %g; kill -STOP %d" % (pid, step_s, pid)], check=True)
    raise AssertionError("the scheduler never reached the wanted state: %s" % sched_stats(g))


def queued(st):
    """Requests the scheduler holds (waiting or running), from its stats."""
    return st.get("scheduler.waiting", 0) + st.get("scheduler.running", 0)


def hold_until_queued(g, pid, n):
    """With pid stopped, SIGCONT it once the scheduler holds n requests (or after 20 s)."""
    try:
        pulse_until(g, pid, lambda st: queued(st) >= n)
    finally:
        os.kill(pid, signal.SIGCONT)


def case_batching():
    rnd = random.Random(A.seed)
    reqs = []
    for i in range(32):
        n = 3 + (i * 19) % 58
        r = {"prompt": [rnd.randrange(0, 286) for _ in range(n)], "max_tokens": 8 + (i * 7) % 41,
             "ignore_eos": i % 3 != 0}
        if i % 4 == 1:
            r.update(temperature=0.7 + 0.1 * (i % 5), top_k=(0, 20, 50)[i % 3], top_p=(1.0, 0.9)[i % 2],
                     seed=rnd.randrange(1 << 63))
        reqs.append(r)
    refs = [reference(r) for r in reqs]
    # roomy: all 32 fit in one step; tight: a budget of 48 tokens (chunked prefill) and 48 KV
    # blocks of 8 tokens (preemption by recompute)
    for name, sched, want in (("roomy", {"max_batch_tokens": "256", "max_seqs": "32", "kv_blocks": "1024"}, "seqs"),
                              ("tight", {"max_batch_tokens": "48", "max_seqs": "32", "kv_blocks": "48", "block_size": "8"},
                               "preempt")):
        with gl.Group(A, kind="real", sections={"scheduler": sched}) as g:
            g.start()
            t0 = time.time()
            if want == "seqs":
                # Hold the executor (SIGSTOP) until the scheduler holds all 32 requests, so that
                # the steps after it resumes can batch them all: otherwise a loaded machine
                # delivers the requests over several steps and the width depends on timing.
                ex = g.svc("executor")
                os.kill(ex["pid"], signal.SIGSTOP)
                held = threading.Thread(target=hold_until_queued, args=(g, ex["pid"], len(reqs)))
                held.start()
            res = stream_all(g, reqs)
            if want == "seqs":
                held.join()
            wall = time.time() - t0
            check_answers(reqs, res, refs)
            st = sched_stats(g)
            log = g.read_log()
        s = lambda k: st.get("scheduler." + k, -1)  # noqa: E731
        budget, blocks = int(sched["max_batch_tokens"]), int(sched["kv_blocks"])
        assert s("step_tokens_max") <= budget, "a step went over the token budget: %s" % st
        assert s("mixed_steps") > 0, "no step mixed prefill chunks and decode tokens: %s" % st
        if want == "seqs":
            assert s("step_seqs_max") >= 24, "32 concurrent requests, but at most %d sequences in a step" % s("step_seqs_max")
        else:
            assert s("preemptions") > 0, "the small KV cache caused no preemption: %s" % st
        assert s("requests_finished") >= 32 and s("running") == 0 and s("kv_blocks_free") == blocks, st
        assert "Traceback" not in log
        print("  %s: 32 clients, %d tokens in %.2f s; %d steps, at most %d sequences / %d tokens a step, %d mixed steps, "
              "%d preemptions" % (name, sum(len(x[0]) for x in res), wall, s("steps"), s("step_seqs_max"),
                                  s("step_tokens_max"), s("mixed_steps"), s("preemptions")))


def stream_and_kill(g, reqs, victim):
    """Stream reqs from client threads and kill -9 the service victim once the scheduler has
    applied a few tokens of every request and finished none. A client thread may see its tokens
    long after the scheduler applied them (many threads on a loaded machine), so the moment is
    chosen from the scheduler's counters with the executor stopped: held until every request is
    queued, then let run a few ms at a time until each has a few tokens, then the victim is killed
    while the executor is still stopped. Returns (results, the victim's record, stats at the kill)."""
    n = len(reqs)
    ex, old = g.svc("executor"), g.svc(victim)
    os.kill(ex["pid"], signal.SIGSTOP)
    out = {"res": [AssertionError("the client threads did not finish")] * n}
    streams = threading.Thread(target=lambda: out.update(res=stream_all(g, reqs)))
    streams.start()
    try:
        pulse_until(g, ex["pid"], lambda st: queued(st) >= n)
        at_kill = pulse_until(g, ex["pid"], lambda st: st.get("scheduler.generated_tokens", 0) >= 4 * n, step_s=0.003)
    finally:
        os.kill(old["pid"], signal.SIGKILL)  # a stopped process dies too
        if victim != "executor":
            os.kill(ex["pid"], signal.SIGCONT)
    streams.join()
    assert at_kill.get("scheduler.requests_finished") == 0 and at_kill.get("scheduler.running") == n, \
        "at the kill: %s" % at_kill
    return out["res"], old, at_kill


def case_executor_crash():
    rnd = random.Random(A.seed + 1)
    reqs = long_reqs(rnd, [2 + i % 9 for i in range(16)], 200, temperature=0.9, top_k=40, top_p=0.95)
    refs = [reference(r) for r in reqs]
    with gl.Group(A, kind="real") as g:
        g.start()
        res, old, at_kill = stream_and_kill(g, reqs, "executor")
        check_answers(reqs, res, refs)
        new = g.wait_svc("executor", lambda s: s["restarts"] >= 1 and s["state"] == "ready", timeout=20)
        assert new["pid"] != old["pid"], (old, new)
        st = sched_stats(g)
        log = g.read_log()
    s = lambda k: st.get("scheduler." + k, -1)  # noqa: E731
    # every request was running with tokens computed, so each is replayed (re-prefilled)
    assert s("executor_restarts") >= 1 and s("replayed_seqs") == len(reqs), st
    assert s("requests_finished") == len(reqs) and s("generated_tokens") == 200 * len(reqs), st
    assert "built over the weight arenas" in log, "the restarted executor did not use the arena"
    # the executor's own counters come through the scheduler (executor `stats`): the new one
    # built its model over the arena and ran the replayed steps
    assert s("executor.from_arena") == 1 and s("executor.pid") == new["pid"] and s("executor.steps") > 0, st
    print("  kill -9 of the executor after %d tokens (16 requests running, none finished); %d sequences replayed; "
          "the new executor built its model in %.1f ms"
          % (at_kill["scheduler.generated_tokens"], s("replayed_seqs"), s("executor_load_ms")))


def case_scheduler_crash():
    rnd = random.Random(A.seed + 2)
    reqs = long_reqs(rnd, [3 + i for i in range(8)], 300, temperature=0.8, top_k=30, top_p=0.9)
    refs = [reference(r) for r in reqs]
    with gl.Group(A, kind="real") as g:
        g.start()
        res, old, at_kill = stream_and_kill(g, reqs, "scheduler")
        check_answers(reqs, res, refs)
        new = g.wait_svc("scheduler", lambda s: s["restarts"] >= 1 and s["state"] == "ready", timeout=20)
        assert new["pid"] != old["pid"], (old, new)
        st = sched_stats(g)
    # The new scheduler (whose counters these are) ran requests of the old one: those the router
    # resubmitted when it saw the new instance, or submits still queued in ZeroMQ when the old
    # one died, delivered to the new one on reconnect (it may finish them all before the router's
    # next hello, and then nothing is left to resubmit).
    assert st.get("scheduler.requests_submitted", 0) >= 1, st
    print("  kill -9 of the scheduler after %d tokens (8 requests running, none finished); the new scheduler ran %d "
          "requests (the router resubmitted %d)" % (at_kill["scheduler.generated_tokens"], st["scheduler.requests_submitted"],
                                                   st.get("router.resubmits", 0)))


def case_q8():
    """[executor] cpu_act = q8 on an int4 pack of the demo model: 8 concurrent clients get exactly
    what `strata generate --cpu-act q8` gives, and the executor reports the mode."""
    int4 = os.path.join(A.work, "int4")
    out = subprocess.run([A.strata, "pack", os.path.join(A.work, "hf"), int4, "--format", "int4", "--group", "32",
                          "--quiet"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out
    rnd = random.Random(A.seed + 3)
    reqs = long_reqs(rnd, [3 + 5 * i for i in range(8)], 24, temperature=0.8, top_k=30, top_p=0.95)
    refs = [reference(r, model=int4, extra=["--cpu-act", "q8"]) for r in reqs]
    B = argparse.Namespace(**vars(A))
    B.model = int4
    with gl.Group(B, kind="real", sections={"executor": {"cpu_act": "q8"}}) as g:
        g.start()
        res = stream_all(g, reqs)
        check_answers(reqs, res, refs)
        st = sched_stats(g)
    assert st.get("scheduler.executor.cpu_act_q8") == 1, st
    print("  8 clients on the int4 pack with cpu_act = q8: every answer equals strata generate --cpu-act q8")


def case_eos_set():
    """A packed model with several eos ids, through the real group (see the module docstring)."""
    m = os.path.join(A.work, "eos")
    os.mkdir(m)
    for f in os.listdir(A.model):  # hard links: the weights are the demo pack's, unchanged
        if f != "generation_config.json":
            os.link(os.path.join(A.model, f), os.path.join(m, f))
    rnd = random.Random(A.seed + 4)
    prompt = [rnd.randrange(3, 286) for _ in range(6)]
    n = 24
    g0 = reference({"prompt": prompt, "max_tokens": n, "ignore_eos": True}, model=m)
    k = next(i for i in range(4, n) if g0[i] not in g0[:i])  # the 5th greedy token, or the next new one
    other = next(t for t in range(8191, 0, -1) if t not in g0)
    with open(os.path.join(m, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": [other, g0[k]], "pad_token_id": 0}, f)
    greedy = {"prompt": prompt, "max_tokens": n}
    want = reference(greedy, model=m)
    assert want == g0[:k + 1], "strata generate on the copy: %s, want %s" % (want, g0[:k + 1])
    sampled = [{"prompt": [rnd.randrange(3, 286) for _ in range(4 + i)], "max_tokens": 40, "temperature": 1.3,
                "top_k": 8, "seed": rnd.randrange(1 << 63)} for i in range(6)]
    refs = [reference(r, model=m) for r in sampled]
    B = argparse.Namespace(**vars(A))
    B.model = m
    from strata_client import StrataClient
    with gl.Group(B, kind="real") as g:
        g.start()
        with StrataClient("tcp://127.0.0.1:%d" % g.port, timeout=60.0) as c:
            text, toks, d = c.complete(tokens=prompt, max_tokens=n)
            assert toks == want and d["finish_reason"] == "stop", (toks, d, want)
            before = c.complete(tokens=prompt, max_tokens=k)[0]  # the text of the tokens before the eos
            with_eos = c.complete(tokens=prompt, max_tokens=k + 1, ignore_eos=True)
            assert text == before and with_eos[1] == want and with_eos[2]["finish_reason"] == "length", \
                (text, before, with_eos)
            assert with_eos[0] != before, "the eos token %d has no text of its own: %r" % (g0[k], with_eos[0])
            text2, toks2, d2 = c.complete(tokens=prompt, max_tokens=n, stream=False)
            assert toks2 == want and text2 == before and d2["finish_reason"] == "stop", (toks2, text2, d2)
            _, toks3, d3 = c.complete(tokens=prompt, max_tokens=n, ignore_eos=True)
            assert toks3 == g0 and d3["finish_reason"] == "length", (toks3, d3)
        res = stream_all(g, sampled)
        check_answers(sampled, res, refs)
        log = g.read_log()
    stops = sum(1 for r, ref in zip(sampled, refs) if len(ref) < r["max_tokens"])
    assert "built over the weight arenas" in log, "the executor did not use the arena"
    assert "eos %d %d," % (other, g0[k]) in log, "the scheduler did not get both eos ids:\n%s" % log
    print("  greedy: %d tokens, stopped at the second eos id %d (token %d); 6 sampled answers equal strata generate "
          "(%d of them stopped at an eos id)" % (len(want), g0[k], k + 1, stops))


CASES = {"batching": case_batching, "executor_crash": case_executor_crash, "scheduler_crash": case_scheduler_crash,
         "q8": case_q8, "eos_set": case_eos_set}


def main():
    global A
    A = gl.real_group_args()
    A.fake = A.executor  # grouplib wants one; every service is real here
    A.seed = int(os.environ.get("STRATA_SEED", "0") or 0) or int(time.time())
    print("seed: STRATA_SEED=%d" % A.seed, flush=True)
    work = tempfile.mkdtemp(prefix="strata-engine-model-")
    try:
        out = subprocess.run([A.strata, "demo", "--out", work], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out
        A.model = out.stdout.strip()
        A.work = work
        gl.run_cases(CASES, A.cases or list(CASES))
    finally:
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
