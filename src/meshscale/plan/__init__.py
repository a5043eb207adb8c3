"""The planner: search every hybrid layout for a model, cluster and batch (search.py), rank them, explain the
winner (explain.py), sweep device counts (scaling.py) and budgets (budget.py). Nothing is imported here, so
that `meshscale predict` loads none of it."""
