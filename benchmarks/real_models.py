"""Real models, as people compile them: eager vs torch.compile vs minicompile, in one run.

    python benchmarks/real_models.py [--device cpu|cuda] [--models a,b] [--repeat N] [--out DIR]

On a GPU (the models the published tables use, random weights, fp32 with TF32 matrix
products): torchvision ResNet-50 (batch 64), MobileNetV3-Large (64), ViT-L/16 (8); Hugging Face
BERT-base (16 x 128 tokens), GPT-2 with its LM head (8 x 512), a Llama-style model (1024 wide,
8 layers, 16 query and 4 key/value heads; 8 x 512). On a CPU, five small ones that 2 cores can
run: Hugging Face's ResNet-18 (64 px, batch 8), a 4-layer BERT (256 wide, 8 x 64), GPT-2 and
a Llama-style model of that size, a 4-layer ViT (64 px).

Inference (no_grad, eval mode, use_cache off). For each model: every result checked against
eager's, first call (compilation, with compile caches made empty for this run; minicompile's
before torch.compile's, so what a first call warms in the process helps torch.compile's),
medians of the steady state (CUDA events on a GPU), speedups over eager, each compiler's graph
count, and minicompile's kernel count. Writes real_models_<cpu|h100|...>.json.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import cold_caches  # noqa: E402,F401  (before torch: first calls in this run are cold)

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import minicompile  # noqa: E402
from minicompile import bench  # noqa: E402


def _hf(cls_name, cfg_name, **cfg):
    import transformers
    return getattr(transformers, cls_name)(getattr(transformers, cfg_name)(**cfg))


def _tokens(batch, length, vocab=1000):
    return lambda device: (torch.randint(0, vocab, (batch, length), device=device),)


def _images(batch, size):
    return lambda device: (torch.randn(batch, 3, size, size, device=device),)


def _tv(name):
    def make():
        import torchvision
        return getattr(torchvision.models, name)(weights=None)
    return make


# name -> (make the model, make the inputs on a device)
GPU_MODELS = {
    "resnet50": (_tv("resnet50"), _images(64, 224)),
    "mobilenet_v3_large": (_tv("mobilenet_v3_large"), _images(64, 224)),
    "vit_l_16": (_tv("vit_l_16"), _images(8, 224)),
    "bert_base": (lambda: _hf("BertModel", "BertConfig"), _tokens(16, 128)),
    "gpt2": (lambda: _hf("GPT2LMHeadModel", "GPT2Config"), _tokens(8, 512)),
    "llama_style": (lambda: _hf("LlamaForCausalLM", "LlamaConfig", hidden_size=1024, intermediate_size=2816,
                                num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                                vocab_size=32000), _tokens(8, 512)),
}
CPU_MODELS = {
    "resnet18_64px": (lambda: _hf("ResNetModel", "ResNetConfig", layer_type="basic", depths=[2, 2, 2, 2],
                                  hidden_sizes=[64, 128, 256, 512]), _images(8, 64)),
    "bert_small": (lambda: _hf("BertModel", "BertConfig", hidden_size=256, num_hidden_layers=4,
                               num_attention_heads=4, intermediate_size=1024), _tokens(8, 64)),
    "gpt2_small": (lambda: _hf("GPT2LMHeadModel", "GPT2Config", n_embd=256, n_layer=4, n_head=4,
                               vocab_size=1000), _tokens(8, 64)),
    "llama_small": (lambda: _hf("LlamaForCausalLM", "LlamaConfig", hidden_size=256, intermediate_size=704,
                                num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                                vocab_size=1000), _tokens(8, 64)),
    "vit_small_64px": (lambda: _hf("ViTModel", "ViTConfig", hidden_size=192, num_hidden_layers=4,
                                   num_attention_heads=3, intermediate_size=768, image_size=64,
                                   patch_size=8), _images(8, 64)),
}


def main_output(out):
    """The tensor a model's callers use: the logits or last hidden state (or the tensor itself)."""
    if isinstance(out, torch.Tensor):
        return out
    for key in ("logits", "last_hidden_state", "pooler_output"):
        if key in out:
            return out[key]
    return out[0]


def dynamo_graphs() -> int:
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default=None, help="comma-separated names (default: all for the device)")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--out", default=None)
    parser.add_argument("--name", default="real_models", help="results file name (before the device)")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    zoo = GPU_MODELS if args.device == "cuda" else CPU_MODELS
    names = args.models.split(",") if args.models else list(zoo)
    # TF32 products (10-bit mantissas) through 50 layers: differences of a few 1e-2 in logits
    tolerance = dict(rtol=2e-2, atol=5e-2) if args.device == "cuda" else dict(rtol=1e-3, atol=1e-3)
    results = {}
    for name in names:
        make_model, make_inputs = zoo[name]
        torch.manual_seed(0)
        model = make_model().to(args.device).eval()
        if hasattr(model, "config"):
            model.config.use_cache = False
        inputs = make_inputs(args.device)
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        minicompile.reset()
        minicompile.metrics.reset()
        theirs, ours = torch.compile(model), minicompile.compile(model)
        fns = {"eager": lambda *a: main_output(model(*a)),
               "minicompile": lambda *a: main_output(ours(*a)),
               "torch.compile": lambda *a: main_output(theirs(*a))}
        try:
            with torch.no_grad():
                records = bench.compare(fns, list(inputs), repeat=args.repeat, **tolerance)
        except Exception as err:                # a model that fails is reported, not hidden
            results[name] = {"error": f"{type(err).__name__}: {str(err)[:500]}"}
            print(f"{name}: FAILED {results[name]['error']}")
            continue
        results[name] = {"input_shapes": [list(t.shape) for t in inputs], "records": records,
                         "graphs": {"torch.compile": dynamo_graphs(), "minicompile": minicompile.metrics.graphs},
                         "minicompile_graph_breaks": minicompile.metrics.graph_breaks,
                         "minicompile_kernels": minicompile.metrics.kernels}
        rec = records
        print(f"{name:<20}{rec['eager']['median_ms']:>10.3f}{rec['torch.compile']['speedup']:>8.2f}"
              f"{rec['minicompile']['speedup']:>8.2f}{rec['torch.compile']['first_call_s']:>9.1f}"
              f"{rec['minicompile']['first_call_s']:>9.1f}"
              f"{results[name]['graphs']['torch.compile']:>5}/{results[name]['graphs']['minicompile']}",
              flush=True)
        del theirs, ours, model
        if args.device == "cuda":
            torch.cuda.empty_cache()
        save(args, results)            # after each model: a run cut short keeps what it measured


def save(args, results):
    suffix = "cpu" if args.device == "cpu" else torch.cuda.get_device_name().split()[1].lower()
    payload = {"precision": "fp32 (TF32 matmuls on GPU)", "mode": "inference, no_grad, eval, use_cache off",
               "models": results}
    path = bench.save_results(f"{args.name}_{suffix}", payload, directory=args.out)
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    print(f"{'model':<20}{'eager ms':>10}{'t.c x':>8}{'mini x':>8}{'t.c 1st':>9}{'mini 1st':>9}{' graphs t.c/mini':>16}")
    main()
