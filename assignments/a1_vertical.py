"""Assignment 1: vertical fusion of a pointwise chain (notebook 41).

The task starts from eager's plan: every value has a buffer and a kernel of its own
(`StoreEverything`, then `make-kernels`). `FusePointwise` walks the kernels in order and merges
each into the kernel just before it when `why_not` says nothing against it; `elide-stores` then
keeps the merged intermediates in registers. Write `why_not`.
"""
from minicompile.fusion import FusionPass, Kernel, Member
from minicompile.fusion.passes import fuse_consecutive, merge, reads_are_local


class FusePointwise(FusionPass):
    """Merge a pointwise kernel into the pointwise kernel just before it."""
    name = "fuse-pointwise"

    def run(self, state):
        fuse_consecutive(state, self.name, self.join)

    def join(self, group: Kernel, new: Kernel) -> str | None:
        reason = self.why_not(group, new)
        if reason is None:
            merge(group, group.members + [Member(new.box, "flat")], group.x_sizes, [], new)
        return reason

    def why_not(self, group: Kernel, new: Kernel) -> str | None:
        """None when `new` (a kernel of one member) may join `group`, else the reason it may not
        (the fusion log shows it). Both walk their elements in one flat loop, so `new` may join
        only when neither kernel reduces (`kernel.kind`), its result has the group's sizes
        (`new.box.shape`, `group.x_sizes`), and it reads the group's results only at the element
        it computes (`reads_are_local(members, x_sizes, [])`, with `new` as a "flat" `Member`)."""
        # TASK 1
        raise NotImplementedError("Task 1 is not implemented yet: write FusePointwise.why_not in assignments/a1_vertical.py")
        # END TASK 1
