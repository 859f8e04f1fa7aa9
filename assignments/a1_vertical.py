"""Assignment 1: vertical fusion of a pointwise chain (notebook 41).

The task starts from eager's plan: every value has a buffer and a kernel of its own
(`StoreEverything`, then `make-kernels`). `FusePointwise` walks the kernels in order and merges
each into the kernel just before it when `why_not` says nothing against it; `elide-stores` then
keeps the merged intermediates in registers. Write `why_not`.
"""
from minicompile.fusion import FusionPass, Kernel, Member
from minicompile.fusion.passes import merge, reads_are_local, renumber


class FusePointwise(FusionPass):
    """Merge a pointwise kernel into the pointwise kernel just before it."""
    name = "fuse-pointwise"

    def run(self, state):
        out = []
        for step in state.steps:
            prev = out[-1] if out else None
            if isinstance(step, Kernel) and isinstance(prev, Kernel):
                reason = self.why_not(prev, step)
                if reason is None:
                    merge(prev, prev.members + [Member(step.box, "flat")], prev.x_sizes, [], step)
                    state.log(f"{self.name}: {step.box.name} joins {prev.name}")
                    continue
                state.log(f"{self.name}: {step.name} ({step.box.name}) not fused with {prev.name}: {reason}")
            out.append(step)
        renumber(out)
        state.steps = out

    def why_not(self, group: Kernel, new: Kernel) -> str | None:
        """None when `new` (a kernel of one member) may join `group`, else the reason it may not
        (the fusion log shows it). Both walk their elements in one flat loop, so `new` may join
        only when neither kernel reduces (`kernel.kind`), its result has the group's sizes
        (`new.box.shape`, `group.x_sizes`), and it reads the group's results only at the element
        it computes (`reads_are_local(members, x_sizes, [])`, with `new` as a "flat" `Member`)."""
        # TASK 1
        raise NotImplementedError("Task 1 is not implemented yet: write FusePointwise.why_not in assignments/a1_vertical.py")
        # END TASK 1
