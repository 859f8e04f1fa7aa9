"""The reference solutions of the assignments (the teacher's: remove before handing out)."""
