"""Part III's assignments: one fusion pass to complete per file, a1_vertical.py .. a5_rows.py,
each at the place marked `# TASK n`. Notebooks 41-45 explain them; `python -m minicompile.grade`
grades them. The teacher's reference solutions are in solutions/ (not handed out)."""
