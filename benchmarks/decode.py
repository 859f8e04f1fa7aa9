"""Greedy decoding at batch 1 with a static KV cache: time per token, eager beside both compilers'
default and reduce-overhead modes.

    python benchmarks/decode.py [--models gpt2,llama_style] [--tokens N] [--repeat R] [--out DIR]

Per model (Hugging Face GPT-2 124M and the Llama-style model of real_models.py, random
weights, fp32), in one run: eager, torch.compile and minicompile, each in its default mode and
with mode="reduce-overhead" (CUDA graphs). Each version decodes from the same 32-token prompt,
which eager prefills into a `transformers.StaticCache` (its tensors marked as at a fixed
address, as the cache marks them itself); the compiled function is one decoding step
(`step(token, cache, position) -> logits`), the way Hugging Face's own compiled generation
compiles `forward`. A token's time is the time of `--tokens` steps queued back to back (the next
step's input is this step's argmax, on the GPU), between CUDA events, divided by their number;
the median of `--repeat` such runs, each on the cache reset to the prompt, after one run of
warm-up (compiling, recording). The tokens must be eager's. On a CPU, reduce-overhead runs the
default path (nothing to record), and the model is smaller (gpt2_small and llama_small of
real_models.py). Writes decode_<device>.json to --out, else $OUT, else benchmarks/results/.
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from minicompile import bench  # noqa: E402
from modes import versions  # noqa: E402
from real_models import CPU_MODELS, GPU_MODELS  # noqa: E402

PROMPT = 32


def static_cache(model, max_len: int, device):
    """A StaticCache of max_len positions for batch 1 (its signature differs across versions)."""
    from transformers import StaticCache
    try:
        return StaticCache(config=model.config, max_cache_len=max_len)
    except TypeError:                    # older transformers: batch, device and dtype given
        return StaticCache(config=model.config, max_batch_size=1, max_cache_len=max_len,
                           device=device, dtype=torch.float32)


class Decoder:
    """One version's decoding: a step function, the model's cache, the prompt prefilled."""

    def __init__(self, model, step, prompt, max_len):
        self.model, self.step, self.prompt = model, step, prompt
        self.cache = static_cache(model, max_len, prompt.device)
        self.position = torch.zeros(1, dtype=torch.long, device=prompt.device)

    def prefill(self):
        """The cache reset (in place: same addresses) and the prompt run through eager."""
        self.cache.reset()
        n = self.prompt.shape[1]
        logits = self.model(self.prompt, past_key_values=self.cache, use_cache=True,
                            cache_position=torch.arange(n, device=self.prompt.device)).logits
        self.position.fill_(n)
        return logits[:, -1:].argmax(-1)

    def decode(self, tokens: int):
        """Greedy decoding of `tokens` tokens after the prompt: the tokens (1 x tokens) and
        the seconds of the steps (to the GPU's end)."""
        token = self.prefill()
        out = []
        device = self.prompt.device
        if device.type == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            t0 = time.perf_counter()
        for _ in range(tokens):
            logits = self.step(token, self.cache, self.position)
            token = logits[:, -1:].argmax(-1)
            self.position.add_(1)
            out.append(token)
        if device.type == "cuda":
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            seconds = time.perf_counter() - t0
        return torch.cat(out, 1), seconds


def measure(model, prompt, tokens: int, repeat: int) -> dict:
    def decoding_step(token, cache, position):
        return model(token, past_key_values=cache, cache_position=position, use_cache=True).logits
    records, reference = {}, None
    for label, step in versions(decoding_step).items():
        decoder = Decoder(model, step, prompt, max_len=PROMPT + tokens)
        start = time.perf_counter()
        with torch.no_grad():
            first, _ = decoder.decode(tokens)          # warm-up: compiles, records
        first_run_s = time.perf_counter() - start
        with torch.no_grad():
            runs = [decoder.decode(tokens) for _ in range(repeat)]
        if reference is None:
            reference = first
        same = all(torch.equal(t, reference) for t in [first] + [t for t, _ in runs])
        per_token = sorted(s / tokens * 1e3 for _, s in runs)
        records[label] = {"ms_per_token": statistics.median(per_token),
                          "ms_per_token_range": [per_token[0], per_token[-1]],
                          "first_run_s": first_run_s, "tokens_equal_eager": same}
        print(f"  {label:<32}{records[label]['ms_per_token']:>9.3f} ms/token"
              f"{first_run_s:>8.1f} s first{'' if same else '  TOKENS DIFFER'}", flush=True)
        del decoder
    eager = records["eager"]["ms_per_token"]
    for r in records.values():
        r["speedup"] = eager / r["ms_per_token"]
    return records


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default=None)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    zoo = {"gpt2": GPU_MODELS["gpt2"], "llama_style": GPU_MODELS["llama_style"]} if args.device == "cuda" \
        else {"gpt2_small": CPU_MODELS["gpt2_small"], "llama_small": CPU_MODELS["llama_small"]}
    names = args.models.split(",") if args.models else list(zoo)
    results = {}
    for name in names:
        torch.manual_seed(0)
        model = zoo[name][0]().to(args.device).eval()
        prompt = torch.randint(0, model.config.vocab_size, (1, PROMPT), device=args.device)
        print(name, flush=True)
        results[name] = {"prompt": PROMPT, "tokens": args.tokens, "records": measure(model, prompt, args.tokens,
                                                                                     args.repeat)}
        suffix = "cpu" if args.device == "cpu" else torch.cuda.get_device_name().split()[1].lower()
        path = bench.save_results(f"decode_{suffix}", {
            "what": "greedy decoding, batch 1, static KV cache, fp32; time per token of steps queued "
                    "back to back", "models": results}, directory=args.out)
        del model
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
