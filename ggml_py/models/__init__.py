"""Model graphs: synthetic (planning) and, with the op builders, computable ones."""
