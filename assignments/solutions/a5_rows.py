"""Assignment 5: a reduction with its producers and consumers in one kernel (notebook 45).

Softmax is three loops over each row: the maximum, the sum of exponentials, the division. One
kernel can run all three over a row while the row is in cache, keeping the maximum and the sum
in registers. `FuseRowsAgain` (the built-in `fuse-rows`, rewritten) walks the kernels in order
and asks `merge` to merge each into the kernel just before it. Write `merge`.
"""
import math

from minicompile import ir
from minicompile.fusion import FusionPass, Kernel, Member
from minicompile.fusion.passes import fuse_consecutive, merge, reads_are_local


class FuseRowsAgain(FusionPass):
    """Merge a kernel into the kernel just before it when both walk the same rows."""
    name = "fuse-rows-again"

    def run(self, state):
        fuse_consecutive(state, self.name, self.merge)

    def merge(self, group: Kernel, new: Kernel) -> str | None:
        """Merge `new` (one member) into `group` and return None, or return why not.

        A kernel walks rows x (`x_sizes`, in parallel) and, when it reduces, the elements r of
        each row (`r_sizes`); each member has a role: "row" (one value per (x, r)), "x" (one per
        row: a reduction, or a pointwise over its results) or "flat" (no r loops). A reduction
        (`isinstance(new.members[0].comp, ir.Reduction)`, over `new.x_sizes` x `new.r_sizes`)
        joins a group over the same rows; a pointwise group over whole rows (x_sizes = nx + nr)
        becomes "row" members of the new loops. A pointwise `new` joins as "flat", "row" or "x"
        by its shape. Only reductions over trailing dims (`comp.trailing`) take part. Last,
        `reads_are_local(members, x_sizes, r_sizes)` must hold; then
        `merge(group, members, x_sizes, r_sizes, new)` makes the kernel."""
        # TASK 5
        def per_row(shape, x_sizes):
            return list(shape[:len(x_sizes)]) == list(x_sizes) and all(s == 1 for s in shape[len(x_sizes):])

        kernels_members = group.members + new.members
        if len(new.members) != 1 or any(isinstance(m.comp, ir.Reduction) and not m.comp.trailing
                                        for m in kernels_members):
            return "a reduction that does not reduce trailing dims"
        member = new.members[0]
        gx, gr = group.x_sizes, group.r_sizes
        roles = [m.role for m in group.members]
        if isinstance(member.comp, ir.Reduction):
            nx, nr = new.x_sizes, new.r_sizes
            if gr and (gx, gr) != (nx, nr):
                return "other rows"
            if not gr:
                if gx == nx + nr:
                    roles = ["row"] * len(roles)
                elif math.prod(gx) == math.prod(nx) and per_row(gx, nx):
                    roles = ["x"] * len(roles)
                else:
                    return "other rows"
                gx, gr = nx, nr
            role = "x"
        else:
            shape = list(member.box.shape)
            if not gr and shape == gx:
                role = "flat"
            elif gr and shape == gx + gr:
                role = "row"
            elif gr and per_row(shape, gx):
                role = "x"
            else:
                return "other shape"
        members = [Member(m.box, r) for m, r in zip(group.members, roles)] + [Member(member.box, role)]
        if not reads_are_local(members, gx, gr):
            return "it reads the kernel's results at other elements or rows"
        merge(group, members, gx, gr, new)
        return None
        # END TASK 5
