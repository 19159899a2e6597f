"""placeholder"""
NAME="qlsd-logistic"; SUMMARY="wip"; FULL={}; QUICK={}
def run(*a, **k): raise NotImplementedError
