"""Assignment 3: horizontal fusion of siblings across an extern call (notebook 43).

The task starts from a `fuse-rows` that merges a kernel only into the kernel just before it
(the package's own looks back a few steps, as this pass does). Two reductions of the same rows
with a matrix product between them (`x.sum(-1)`, `x @ w`, `x.amax(-1)`) stay two kernels there,
and x is read twice. `FuseSiblings` tries to move each kernel up into an earlier kernel over the
same rows (`FuseRows().merge` checks the rows and the reads); moving it past the steps between
is only right when it does not need their results. Write `why_not_move`.
"""
from minicompile.fusion import FusionPass, Kernel
from minicompile.fusion.passes import FuseRows, loads, renumber, stores


class FuseSiblings(FusionPass):
    """Merge a kernel into an earlier kernel over the same rows, past the steps between."""
    name = "fuse-siblings"

    def run(self, state):
        steps = list(state.steps)
        j = 0
        while j < len(steps):
            new = steps[j]
            for i in range(j - 1 if isinstance(new, Kernel) else -1):   # the previous one: fuse-rows
                group = steps[i]
                if not isinstance(group, Kernel):
                    continue
                reason = self.why_not_move(steps[i + 1:j], new) or FuseRows().merge(group, new)
                if reason is None:
                    state.log(f"{self.name}: {new.name} ({new.box.name}) joins {group.name}")
                    del steps[j]
                    j -= 1
                    break
                state.log(f"{self.name}: {new.name} ({new.box.name}) not fused with {group.name}: {reason}")
            j += 1
        renumber(steps)
        state.steps = steps

    def why_not_move(self, between: list, new: Kernel) -> str | None:
        """None when `new` may run before the steps `between` (kernels and extern calls), else
        why not. `loads(step)` and `stores(step)` are the names of the buffers a step reads and
        writes."""
        # TASK 3
        needs = loads(new)
        for step in between:
            written = stores(step) & needs
            if written:
                return f"it reads {', '.join(sorted(written))}, written after that kernel"
        return None
        # END TASK 3
