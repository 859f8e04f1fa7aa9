"""Training steps: eager vs torch.compile vs minicompile, in one run.

    python benchmarks/training.py [--device cpu|cuda] [--models a,b] [--repeat N] [--out DIR]

A step is forward, loss (mean of squares of the model's main output), backward and an SGD step
(lr 1e-3, gradients set to None), each compiler on its own copy of the same weights and the
same batch. On a CPU: the book's MLP, CNN and GPT block (benchmarks/models.py, batches a
CPU can run). On a GPU (fp32, TF32 matrix products, random weights): the book's three at full
size, torchvision ResNet-50 (batch 32) and ViT-L/16 (batch 8) when torchvision imports, Hugging
Face BERT-base (16 x 128 tokens), GPT-2 with its LM head (8 x 512) and a Llama-style model
(real_models.py's: 1024 wide, 8 layers; 8 x 512), from their configs. With --checkpoint: the
Hugging Face three with activation checkpointing on (every layer through torch.utils.checkpoint).

For each model: the first step of each (compilation included, with compile caches made empty
for this run; minicompile's split by stage; minicompile's taken before torch.compile's, so that
what a first call warms in the process, PyTorch's fake-tensor caches and Triton's runtime among
it, helps torch.compile's and not minicompile's), medians of steady-state steps after warm-up
(CUDA events on a GPU), speedups over eager, losses checked equal, each compiler's graph count,
minicompile's forward and backward kernel counts, and on a GPU the peak memory of one step. Writes training_<device>.json
to --out, else $OUT, else benchmarks/results/.
"""
import argparse
import copy
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import cold_caches  # noqa: E402,F401  (before torch: first calls in this run are cold)

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import minicompile  # noqa: E402
import models as book  # noqa: E402
from minicompile import bench  # noqa: E402


def _book(name, scale):
    def make(device):
        return book.model_and_input(name, device, scale=scale)
    return make


def _hf(cls_name, cfg_name, batch, length, **cfg):
    def make(device):
        import transformers
        model = getattr(transformers, cls_name)(getattr(transformers, cfg_name)(**cfg)).to(device)
        return model, torch.randint(0, model.config.vocab_size, (batch, length), device=device)
    return make


def _torchvision(name, batch):
    def make(device):
        import torchvision
        model = getattr(torchvision.models, name)(weights=None).to(device)
        return model, torch.randn(batch, 3, 224, 224, device=device)
    return make


CPU_MODELS = {"mlp": _book("mlp", 1 / 16), "cnn": _book("cnn", 1 / 8), "gpt_block": _book("gpt_block", 1 / 8)}
GPU_MODELS = {"mlp": _book("mlp", 1), "cnn": _book("cnn", 1), "gpt_block": _book("gpt_block", 1),
              "resnet50": _torchvision("resnet50", 32), "vit_l_16": _torchvision("vit_l_16", 8),
              "bert_base": _hf("BertModel", "BertConfig", 16, 128),
              "gpt2": _hf("GPT2LMHeadModel", "GPT2Config", 8, 512),
              "llama_style": _hf("LlamaForCausalLM", "LlamaConfig", 8, 512, hidden_size=1024,
                                 intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                                 num_key_value_heads=4, vocab_size=32000)}


HF_MODELS = ("bert_base", "gpt2", "llama_style")


def main_output(out):
    if isinstance(out, torch.Tensor):
        return out
    for key in ("logits", "last_hidden_state"):
        if key in out:
            return out[key]
    return out[0]


def training_step(model, compiled):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(x):
        loss = main_output(compiled(x)).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def peak_memory_mb(step, x) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step(x)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2 ** 20


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default=None, help="comma-separated names (default: all for the device)")
    parser.add_argument("--repeat", type=int, default=50,
                        help="timed rounds (25 or more: the reported range needs five blocks of five)")
    parser.add_argument("--out", default=os.environ.get("OUT"))
    parser.add_argument("--checkpoint", action="store_true",
                        help="the Hugging Face models with activation checkpointing "
                             "(gradient_checkpointing_enable, use_reentrant=False); "
                             "writes training_<device>_checkpointed.json")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    zoo = GPU_MODELS if cuda else CPU_MODELS
    names = args.models.split(",") if args.models else list(zoo)
    if args.checkpoint:
        names = [n for n in names if n in HF_MODELS]
    tolerance = dict(rtol=2e-2, atol=2e-2) if cuda else dict(rtol=1e-3, atol=1e-3)
    results = {}
    print(f"{'model':<12}{'eager ms':>10}{'tc x':>7}{'mc x':>7}{'tc 1st s':>9}{'mc 1st s':>9}"
          f"{'graphs':>8}{'mc fwd/bwd kernels':>20}")
    for name in names:
        try:
            torch.manual_seed(0)
            model, x = zoo[name](args.device)
        except ImportError as err:               # torchvision or transformers not installed
            results[name] = {"skipped": str(err)}
            print(f"{name}: skipped ({err})")
            continue
        model.train()
        if hasattr(model, "config"):
            model.config.use_cache = False
        if args.checkpoint:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        copies = {label: copy.deepcopy(model) for label in ("eager", "torch.compile", "minicompile")}
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        minicompile.reset()
        minicompile.metrics.reset()
        steps = {"eager": training_step(copies["eager"], copies["eager"]),
                 "minicompile": training_step(copies["minicompile"], minicompile.compile(copies["minicompile"])),
                 "torch.compile": training_step(copies["torch.compile"], torch.compile(copies["torch.compile"]))}
        try:
            records = bench.compare(steps, [x], repeat=args.repeat, **tolerance)
            if cuda:
                for label, step in steps.items():
                    records[label]["peak_memory_mb"] = peak_memory_mb(step, x)
        except Exception as err:                 # a model that fails is reported, not hidden
            results[name] = {"error": f"{type(err).__name__}: {str(err)[:500]}"}
            print(f"{name}: FAILED {results[name]['error']}")
            continue
        from torch._dynamo.utils import counters
        results[name] = {
            "input_shape": list(x.shape), "records": records,
            "graphs": {"torch.compile": counters["stats"]["unique_graphs"], "minicompile": minicompile.metrics.graphs},
            "minicompile_graph_breaks": minicompile.metrics.graph_breaks,
            "minicompile_kernels": minicompile.metrics.kernels,
            "minicompile_backward_kernels": minicompile.metrics.backward_kernels,
            # where minicompile's first call went, by stage (minicompile.metrics.compile_seconds)
            "minicompile_compile_seconds": {k: round(v, 3) for k, v in minicompile.metrics.compile_seconds.items()}}
        r = records
        print(f"{name:<12}{r['eager']['median_ms']:>10.2f}{r['torch.compile']['speedup']:>7.2f}"
              f"{r['minicompile']['speedup']:>7.2f}{r['torch.compile']['first_call_s']:>9.1f}"
              f"{r['minicompile']['first_call_s']:>9.1f}"
              f"{results[name]['graphs']['torch.compile']:>4}/{results[name]['graphs']['minicompile']:<3}"
              f"{minicompile.metrics.kernels - minicompile.metrics.backward_kernels:>12}/"
              f"{minicompile.metrics.backward_kernels}", flush=True)
        if cuda:
            print("    peak MB: " + ", ".join(f"{k} {v['peak_memory_mb']:.0f}" for k, v in records.items()))
        del copies, steps, model
        if cuda:
            torch.cuda.empty_cache()
        save(results, cuda, args.out, args.checkpoint)        # after each model: a run cut short keeps what it measured


def save(results, cuda, out, checkpointed=False):
    device = "cpu" if not cuda else torch.cuda.get_device_name().split()[1].lower()
    path = bench.save_results(f"training_{device}" + ("_checkpointed" if checkpointed else ""),
                              {"models": results, "activation_checkpointing": checkpointed}, out)
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
