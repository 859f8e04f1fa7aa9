"""The optimizer step, compiled: torch.optim's SGD, Adam and AdamW as a few generated kernels.

Takes an optimizer whose `step()` compiled code calls (capture breaks the graph at that call,
and api.py's call at the break runs the step through here) and hands back a callable that does
what `opt.step()` does. The work splits as in eager's own implementation:

- host work stays Python, as in eager: the step hooks, the lazy creation of the state (the
  optimizer's own `_init_group`), the step counts (CPU tensors) and the scalars computed from
  them (bias corrections, step sizes) in double precision;
- the arithmetic on the parameters is one plain function per optimizer below (`sgd_update`,
  `adam_update`: torch's single-tensor code, written out), compiled by minicompile for all the
  parameters of a group at once. Its floats (learning rate, step sizes) are graph inputs, so a
  new step or a scheduler's learning rate does not recompile; the arithmetic on them (`1 -
  beta1`, `-lr`) is done by the host in double precision, as eager does it, before the call.
  Each parameter's update fuses into one kernel, and combo kernels (fusion/passes.py) join
  those of many parameters.

An optimizer or option this does not model (other classes, fused=True, capturable,
differentiable, tensor hyperparameters, sparse or complex gradients, a GradScaler's
found_inf) runs its own `step()`, with the reason in the `graph_breaks` log.
"""
from __future__ import annotations

import inspect
import types
import weakref
from itertools import chain
from typing import Callable

import torch
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

from . import logs


# --------------------------------------------------------------------------------------
# The arithmetic, compiled: torch's single-tensor code for each parameter
# --------------------------------------------------------------------------------------
def sgd_update(params, grads, bufs, neg_lr, weight_decay, momentum, one_minus_dampening,
               nesterov, maximize):
    """SGD on each parameter; -> the momentum buffers (new ones where there were none)."""
    new_bufs = []
    for i, param in enumerate(params):
        grad = grads[i] if not maximize else -grads[i]
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        buf = None
        if momentum != 0:
            buf = bufs[i]
            if buf is None:
                buf = torch.clone(grad).detach()
            else:
                buf.mul_(momentum).add_(grad, alpha=one_minus_dampening)
            grad = grad.add(buf, alpha=momentum) if nesterov else buf
        param.add_(grad, alpha=neg_lr)
        new_bufs.append(buf)
    return new_bufs


def adam_update(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, neg_step_sizes,
                bias_correction2_sqrts, decay, one_minus_beta1, beta2, one_minus_beta2, eps,
                weight_decay, decoupled, amsgrad, maximize):
    """Adam (AdamW with decoupled=True) on each parameter, its step's scalars given."""
    for i, param in enumerate(params):
        grad = grads[i] if not maximize else -grads[i]
        exp_avg, exp_avg_sq = exp_avgs[i], exp_avg_sqs[i]
        if weight_decay != 0:
            if decoupled:
                param.mul_(decay)
            else:
                grad = grad.add(param, alpha=weight_decay)
        exp_avg.lerp_(grad, one_minus_beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=one_minus_beta2)
        if amsgrad:
            torch.maximum(max_exp_avg_sqs[i], exp_avg_sq, out=max_exp_avg_sqs[i])
            denom = (max_exp_avg_sqs[i].sqrt() / bias_correction2_sqrts[i]).add_(eps)
        else:
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrts[i]).add_(eps)
        param.addcdiv_(exp_avg, denom, value=neg_step_sizes[i])


# --------------------------------------------------------------------------------------
# What is modelled
# --------------------------------------------------------------------------------------
def _kind(opt) -> str | None:
    if type(opt) is torch.optim.SGD:
        return "sgd"
    if type(opt) in (torch.optim.Adam, torch.optim.AdamW):
        return "adam"
    return None


def why_not_modelled(opt) -> str | None:
    """None when `opt.step()` can run compiled, else why not (the optimizer and its options;
    the step itself finds sparse and complex gradients, as it gathers them)."""
    kind = _kind(opt)
    if kind is None:
        return f"{type(opt).__name__} is not one of the modelled optimizers (SGD, Adam, AdamW)"
    if getattr(opt, "grad_scale", None) is not None or getattr(opt, "found_inf", None) is not None:
        return "a GradScaler's grad_scale/found_inf is set on the optimizer"
    for group in opt.param_groups:
        for option in ("fused", "capturable", "differentiable"):
            if group.get(option):
                return f"{option}=True"
        if any(isinstance(v, torch.Tensor) for v in group.values() if not isinstance(v, list)) or \
                any(isinstance(b, torch.Tensor) for b in group.get("betas", ())):
            return "a hyperparameter is a tensor"
    return None


def step_method(fn) -> object | None:
    """The optimizer when `fn` is its `step` (bound, or as an LR scheduler wraps it), else None."""
    opt = getattr(fn, "__self__", None)
    if isinstance(opt, torch.optim.Optimizer) and getattr(fn, "__name__", "") == "step":
        return opt
    if getattr(fn, "_wrapped_by_lr_sched", False):
        for cell in fn.__closure__ or ():          # the wrapper holds a weak reference to it
            if isinstance(cell.cell_contents, weakref.ref) and \
                    isinstance(cell.cell_contents(), torch.optim.Optimizer):
                return cell.cell_contents()
    return None


# --------------------------------------------------------------------------------------
# The step
# --------------------------------------------------------------------------------------
class _NotModelled(Exception):
    """Found while gathering a group: the optimizer's own step runs instead."""


class CompiledStep:
    """`opt.step(closure=None)` with the arithmetic compiled by `compile_update(fn)`."""

    def __init__(self, opt, compile_update: Callable, scheduled: bool = False):
        self._opt, self.scheduled = weakref.ref(opt), scheduled      # (the cache of steps is weak)
        sgd = _kind(opt) == "sgd"
        self._compile_update, self._update_fn = compile_update, sgd_update if sgd else adam_update
        self._updates: dict = {}         # a group's position -> its compiled update
        self._gather, self._apply = (self._gather_sgd, self._sgd) if sgd else (self._gather_adam, self._adam)
        self.init_takes_amsgrad = "amsgrad" in inspect.signature(opt._init_group).parameters
        self.decoupled = type(opt) is torch.optim.AdamW          # (where groups do not say)

    @property
    def opt(self):
        return self._opt()

    def __call__(self, closure=None):
        opt = self.opt
        if self.scheduled:
            opt._opt_called = True            # as the LR scheduler's wrapper of step does
        args, kwargs = (opt,), ({} if closure is None else {"closure": closure})
        with torch.autograd.profiler.record_function(f"Optimizer.step#{type(opt).__name__}.step"):
            for pre_hook in chain(_global_optimizer_pre_hooks.values(),
                                  opt._optimizer_step_pre_hooks.values()):
                result = pre_hook(opt, args, kwargs)
                if result is not None:
                    args, kwargs = result
            loss = None
            if kwargs.get("closure") is not None:
                with torch.enable_grad():
                    loss = kwargs["closure"]()
            with torch.no_grad():
                try:
                    gathered = [self._gather(group) for group in opt.param_groups]
                except _NotModelled as why:
                    log_not_modelled(opt, str(why))
                    type(opt).step.__wrapped__(opt)       # its update alone (hooks ran here)
                else:
                    for group, lists in zip(opt.param_groups, gathered):
                        if lists[0]:
                            self._apply(group, *lists)
            opt._optimizer_step_code()
            for post_hook in chain(opt._optimizer_step_post_hooks.values(),
                                   _global_optimizer_post_hooks.values()):
                post_hook(opt, args, kwargs)
        return loss

    def _update_of(self, group) -> Callable:
        """The compiled update of this group: each its own function (named for its position),
        so that groups of other shapes (a learning rate per layer) are not recompiles of one
        function, which would reach the recompile limit where a model has many."""
        at = next(i for i, g in enumerate(self.opt.param_groups) if g is group)
        update = self._updates.get(at)
        if update is None:
            fn = self._update_fn
            name = f"{fn.__name__}_of_group_{at}"
            code = fn.__code__.replace(co_name=name, co_qualname=name)
            update = self._updates[at] = self._compile_update(
                types.FunctionType(code, fn.__globals__, name, fn.__defaults__))
        return update

    def _gather_sgd(self, group) -> tuple:
        params, grads, bufs = [], [], []
        if self.opt._init_group(group, params, grads, bufs):
            raise _NotModelled("a sparse gradient")
        return params, grads, bufs

    def _sgd(self, group, params, grads, bufs) -> None:
        new_bufs = self._update_of(group)(params, grads, bufs, -group["lr"], group["weight_decay"],
                               group["momentum"], 1 - group["dampening"], group["nesterov"],
                               group["maximize"])
        if group["momentum"] != 0:
            for p, buf in zip(params, new_bufs):
                self.opt.state[p]["momentum_buffer"] = buf

    def _gather_adam(self, group) -> tuple:
        lists = ([], [], [], [], [], [])      # params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps
        args = (*lists[:2], group["amsgrad"], *lists[2:]) if self.init_takes_amsgrad else lists
        if self.opt._init_group(group, *args):           # older AdamW's takes amsgrad
            raise _NotModelled("a complex parameter")
        return lists

    def _adam(self, group, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps) -> None:
        torch._foreach_add_(steps, 1)
        beta1, beta2 = group["betas"]
        lr = group["lr"]
        # in double precision on the host, as eager computes them
        counts = [step.item() for step in steps]
        neg_step_sizes = [-(lr / (1 - beta1 ** n)) for n in counts]
        bias_correction2_sqrts = [(1 - beta2 ** n) ** 0.5 for n in counts]
        weight_decay = group["weight_decay"]
        self._update_of(group)(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, neg_step_sizes,
                    bias_correction2_sqrts, 1 - lr * weight_decay, 1 - beta1, beta2, 1 - beta2,
                    group["eps"], weight_decay, group.get("decoupled_weight_decay", self.decoupled),
                    group["amsgrad"], group["maximize"])


def log_not_modelled(opt, reason: str) -> None:
    logs.log("graph_breaks", f"{type(opt).__name__}.step() runs as PyTorch's: {reason}")
