"""Parallelism applied to an unmodified model: the mesh, the data-parallel family, recompute, and
`apply` which turns a Layout into wrapped modules plus the step's communication."""
