"""`soltrain dump` files of one batch on the CPU and on CUDA, compared tensor by tensor (the GPU machine's check
tools): the relative L2 error of each chosen tensor within `tol` and the CPU's not all zero. No pytest here."""


def compare_tensors(cpu, gpu, keep, tol=5e-2):
    """Prints one line per tensor name `keep(name)` accepts; returns the number of failures."""
    failures = 0
    for k in sorted(cpu):
        if not keep(k):
            continue
        a, b = cpu[k].double(), gpu[k].double()
        rel = float((a - b).norm() / max(a.norm(), 1e-30))
        ok = rel <= tol and float(a.norm()) > 0
        failures += not ok
        print(f"{'ok' if ok else 'FAIL'} {k}: rel {rel:.2e} (|cpu| {float(a.norm()):.3e})")
    return failures
