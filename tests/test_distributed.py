"""Compiled training under torch.distributed (minicompile/distributed.py), on a CPU: two
processes with the gloo backend train the book's MLP and GPT block under DDP, FSDP2
(`fully_shard`: the whole model, block by block, and with bfloat16 parameters) and FSDP1
(`use_orig_params` True and False, and wrapped block by block), each beside its eager twin
under the same engine; also a small CNN (batch norm's buffers, which DDP broadcasts), DDP's
find_unused_parameters, and DDP around a model compiled first. After every SGD step the losses,
the gradients, the updated parameters and the buffers must be eager's.

The two processes are started once for the whole file (a module fixture) and run every case;
each test then reads its case's result. They meet through a file store (no port to pick), are
joined with a timeout and killed if they hang, so a deadlock cannot stall the suite."""
import contextlib
import copy
import datetime
import io
import json
import multiprocessing
import os
import sys
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import minicompile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import models  # noqa: E402

WORLD = 2
TIMEOUT_S = 240
CASES = ["ddp-mlp", "ddp-gpt_block", "ddp-cnn", "ddp_unused-mlp_unused", "ddp_of_compiled-gpt_block",
         "fsdp2-mlp", "fsdp2-gpt_block", "fsdp2_per_block-gpt_blocks", "fsdp2_bf16-gpt_block",
         "fsdp1-mlp", "fsdp1_flat-gpt_block", "fsdp1_per_block-gpt_blocks"]
pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not built")


def _model(name):
    torch.manual_seed(0)
    if name == "mlp":
        return models.MLP(width=37, depth=2), (13, 37)
    if name == "mlp_unused":               # a parameter the forward never reads
        model = models.MLP(width=37, depth=2)
        model.unused = nn.Linear(3, 3)
        return model, (13, 37)
    if name == "cnn":                      # batch norm: buffers updated by the compiled code
        return models.SmallCNN(channels=4, classes=4), (3, 3, 6, 6)
    if name == "gpt_block":
        return models.Block(dim=32, heads=4), (2, 7, 32)
    if name == "gpt_blocks":
        return nn.Sequential(models.Block(dim=16, heads=2), models.Block(dim=16, heads=2)), (3, 5, 16)
    raise ValueError(name)


def _wrap(engine, model):
    """The model under the engine (a fresh copy: the twin gets another)."""
    model = copy.deepcopy(model)
    if engine.startswith("ddp"):
        return nn.parallel.DistributedDataParallel(model, find_unused_parameters=engine == "ddp_unused")
    if engine.startswith("fsdp1"):
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        return FullyShardedDataParallel(
            model, use_orig_params=engine != "fsdp1_flat", device_id=torch.device("cpu"),
            auto_wrap_policy=ModuleWrapPolicy({models.Block}) if engine == "fsdp1_per_block" else None)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    # on the CPU (gloo), also where a GPU is present: fully_shard would take the GPU by default
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    if engine == "fsdp2_per_block":
        for block in model:
            fully_shard(block, mesh=mesh)
    if engine == "fsdp2_bf16":     # parameters gathered in bfloat16, gradients reduced in float32
        return fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                            reduce_dtype=torch.float32))
    return fully_shard(model, mesh=mesh)


def _full(t):
    """A gradient or parameter as one comparable tensor (FSDP2's are DTensors: gathered)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _run_case(case, rank, steps=3, lr=0.1):
    engine, name = case.split("-")
    model, shape = _model(name)
    theirs = _wrap(engine, model)
    if engine == "ddp_of_compiled":                # the other order: DDP(compile(model))
        ours = compiled = nn.parallel.DistributedDataParallel(minicompile.compile(copy.deepcopy(model)))
    else:
        ours = _wrap(engine, model)
        compiled = minicompile.compile(ours)
    opt, opt_twin = torch.optim.SGD(ours.parameters(), lr=lr), torch.optim.SGD(theirs.parameters(), lr=lr)
    minicompile.metrics.reset()
    # bfloat16: eager rounds after each op, the compiled kernels once per kernel
    tol = dict(rtol=1.6e-2, atol=1e-3) if "bf16" in engine else dict(rtol=1e-4, atol=1e-5)
    for step in range(steps):
        torch.manual_seed(1000 * step + rank)          # each rank its own batch
        x = torch.randn(shape)
        out = compiled(x)
        target = torch.randn(out.shape)
        loss = (out - target).square().mean()
        loss.backward()
        expected = (theirs(x) - target).square().mean()
        expected.backward()
        torch.testing.assert_close(loss, expected, **tol, msg=f"step {step}: loss")
        for (pname, p), q in zip(ours.named_parameters(), theirs.parameters()):
            if p.grad is None or q.grad is None:        # FSDP1: a rank may hold no part of it
                assert p.grad is None and q.grad is None, f"step {step}: {pname}: one gradient is None"
                continue
            torch.testing.assert_close(_full(p.grad), _full(q.grad), **tol,
                                       msg=f"step {step}: gradient of {pname}")
        opt.step(), opt_twin.step()
        opt.zero_grad(), opt_twin.zero_grad()
        for (pname, p), q in zip(ours.state_dict().items(), theirs.state_dict().values()):
            torch.testing.assert_close(_full(p), _full(q), **tol,
                                       msg=f"step {step}: {pname}")     # parameters and buffers
    m = minicompile.metrics
    return {"graphs": m.graphs, "breaks": m.graph_breaks, "backward_kernels": m.backward_kernels,
            "recompiles": m.recompiles}


def _worker(rank, store_file, out_dir):
    torch.set_num_threads(1)
    # a collective left waiting (the other rank failed a case) raises after a minute, not 30
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    results = {}
    try:
        for case in CASES:
            minicompile.reset()
            log = io.StringIO()
            minicompile.set_logs(graph_breaks=True)
            try:
                with contextlib.redirect_stdout(log):
                    results[case] = _run_case(case, rank)
            except Exception:
                results[case] = {"error": traceback.format_exc()}
            finally:
                minicompile.set_logs(graph_breaks=False)
            results[case]["log"] = log.getvalue()
            dist.barrier()                  # the next case starts together (no half-finished collective)
    finally:
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("distributed")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(rank, str(out / "store"), str(out)), daemon=True)
             for rank in range(WORLD)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + TIMEOUT_S
    try:
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
    finally:
        hung = [p for p in procs if p.is_alive()]
        for p in hung:
            p.kill()
            p.join()
    assert not hung, f"the {WORLD} processes did not finish in {TIMEOUT_S} s"
    ranks = []
    for rank, p in enumerate(procs):
        path = out / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} exited with code {p.exitcode} and wrote no results"
        ranks.append(json.loads(path.read_text()))
    return ranks


@pytest.mark.parametrize("case", CASES)
def test_matches_eager_under_the_same_engine(results, case):
    for rank, res in enumerate(results):
        r = res[case]
        assert "error" not in r, f"rank {rank}:\n{r['error']}"
        # compiled, forward and backward (the backward's kernels are generated code)
        assert r["graphs"] >= 1 and r["backward_kernels"] > 0, r
        # block by block, the second block's input requires grad (the first's output): one
        # recompile of Block.forward, as TorchDynamo makes
        assert r["recompiles"] == ("per_block" in case), r


@pytest.mark.parametrize("case, said", [
    ("fsdp2_per_block-gpt_blocks", "FSDPBlock's hooks run as Python around its compiled forward"),
    ("fsdp1_per_block-gpt_blocks", "FullyShardedDataParallel.forward runs as PyTorch around the "
                                   "compiled Block.forward")])
def test_sharded_blocks_break_the_graph_where_fsdp_communicates(results, case, said):
    """Each block sharded on its own (fully_shard on each, or FSDP1's auto-wrap policy): the
    root's forward breaks at a block's call (its hooks or its wrapper gather the block's
    parameters; here the break is in Sequential's loop, so the root frame runs as Python), and
    each block's forward is compiled on its own, with the hooks or the wrapper run around it."""
    for res in results:
        r = res[case]
        assert r["breaks"] == 1 and r["graphs"] == 2, r
        assert said in r["log"], r["log"]


def test_logs_say_what_runs_around_the_compiled_forward(results):
    logs = results[0]
    assert "DistributedDataParallel.forward runs as PyTorch around the compiled MLP.forward" \
        in logs["ddp-mlp"]["log"]
    assert "all-reduced by DDP's hooks" in logs["ddp-mlp"]["log"]
    assert "FSDPBlock's hooks run as Python around its compiled forward" \
        in logs["fsdp2_per_block-gpt_blocks"]["log"]
    assert "FullyShardedDataParallel.forward runs as PyTorch" in logs["fsdp1-mlp"]["log"]


def test_forward_hooks_run_around_the_compiled_forward():
    """The mechanism without a process group: a module with forward hooks (its own, and a
    pre-hook that edits the input) is compiled, the hooks run as Python around it, and the
    results and gradients are eager's."""
    model, shape = _model("mlp")
    twin = copy.deepcopy(model)
    for m in (model, twin):
        m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
        m.register_forward_hook(lambda mod, args, out: out + 1)
    x = torch.randn(shape)
    compiled = minicompile.compile(model)
    for _ in range(2):
        out, expected = compiled(x), twin(x)
        torch.testing.assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    assert minicompile.metrics.graphs == 1 and minicompile.metrics.recompiles == 0
    assert "forward" not in model.__dict__          # the swap is undone after each call
