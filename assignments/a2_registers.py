"""Assignment 2: keep values in registers (notebook 42).

After `fuse-rows`, a kernel may compute several values (softmax: the row maximum, the sum of
exponentials, the result). A value nobody reads outside its kernel, and that the graph does not
return, need not be written to memory. `KeepInRegisters` drops those stores; write `needed`:
which buffers must stay in memory. Extern calls (matrix products run by PyTorch) read memory.
"""
from minicompile.fusion import FusionPass, Kernel
from minicompile.fusion.passes import loads


class KeepInRegisters(FusionPass):
    """Drop the store of a value that only its own kernel reads."""
    name = "keep-in-registers"

    def run(self, state):
        needed = self.needed(state)
        for step in state.steps:
            if isinstance(step, Kernel) and len(step.members) > 1:
                for m in step.members:
                    if m.box.name in step.stored and m.box.name not in needed:
                        step.stored.discard(m.box.name)
                        state.log(f"{self.name}: {m.box.name} stays in {step.name}'s registers")

    def needed(self, state) -> set[str]:
        """Names of the buffers that must be written to memory: the graph's outputs
        (`state.outputs`, boxes with a `.name`) and every buffer some step reads from memory
        (`loads(step)`: a kernel's loads of other kernels' buffers, an extern call's inputs)."""
        # TASK 2
        raise NotImplementedError("Task 2 is not implemented yet: write KeepInRegisters.needed in assignments/a2_registers.py")
        # END TASK 2
