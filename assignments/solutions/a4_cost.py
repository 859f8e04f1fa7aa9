"""Assignment 4: a cost rule, store or recompute a shared value (notebook 44).

A pointwise value that is not stored is recomputed inside every kernel that reads it. For a
value read by several consumers that saves its store and its loads, but repeats its operations
once per extra consumer. `StoreCostly` asks `should_store` about each pointwise value read by
more than one consumer; write the rule, decided by the operations recomputing would repeat and
the bytes storing would move.
"""
from minicompile import ir
from minicompile.fusion import FusionPass


class StoreCostly(FusionPass):
    """Store a shared pointwise value when recomputing it costs more than storing it."""
    name = "store-costly"

    def run(self, state):
        for box in state.boxes:
            if not box.is_realized and isinstance(box.data, ir.Pointwise) and len(box.readers) > 1:
                if self.should_store(box):
                    box.realize()
                    state.log(f"{self.name}: {box.name} ({box.data.data.origin}) is stored: "
                              f"read by {len(box.readers)} consumers and costly")

    def should_store(self, box) -> bool:
        """Whether to store `box`, read by `len(box.readers)` consumers. Per element:
        `ir.reads_of(box).op_count` operations compute it (the values inlined into it included),
        and storing it writes `box.dtype.itemsize` bytes and reads them back (each reader reads
        them in place of the inputs the expression loads, so count one read). One operation
        costs about as much as moving one byte (a fair guess for both a CPU and a GPU running
        these memory-bound kernels)."""
        # TASK 4
        readers = len(box.readers)
        repeated_ops = (readers - 1) * ir.reads_of(box).op_count
        moved_bytes = 2 * box.dtype.itemsize
        return repeated_ops > moved_bytes
        # END TASK 4
