import torch, minicompile, warnings
import torch.nn.functional as F
minicompile.config.graph_cache = False
x = torch.randn(37, 11, dtype=torch.float64, device="cuda") * 4
fns = {"hardsigmoid": F.hardsigmoid, "hardswish": F.hardswish, "gelu": F.gelu,
       "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "layer_norm": lambda x: F.layer_norm(x, (11,), eps=0.3),
       "erf": torch.erf, "rsqrt": lambda x: torch.rsqrt(x.abs() + 1), "tanh": torch.tanh, "div": lambda x: x / 6.0}
warnings.simplefilter("ignore")
for name, fn in fns.items():
    minicompile.reset()
    got = minicompile.compile(fn)(x)
    print(name, (got - fn(x)).abs().max().item(), minicompile.metrics.kernels)
minicompile.logs.set_logs(output_code=True)
minicompile.reset()
minicompile.compile(fns["layer_norm"])(x)
