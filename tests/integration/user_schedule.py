"""A user's learning-rate schedule, named by file spec in tests (LambdaLR's convention:
the factor of the base rate at an iteration)."""


def halving(iteration: int) -> float:
    return 0.5 ** (iteration // 5)
