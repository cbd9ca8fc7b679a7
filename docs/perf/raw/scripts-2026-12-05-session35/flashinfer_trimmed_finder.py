"""Import a FlashInfer tree whose heavy optional subpackages were left out (device carry limit)."""
import importlib.abc, importlib.machinery, sys, types

SKIPPED = ("flashinfer.fused_moe", "flashinfer.moe_ep", "flashinfer.experimental",
           "flashinfer.gdn_kernels", "flashinfer.cute_dsl.attention", "flashinfer.cute_dsl.sparse")


class _Absent(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Absent(f"{self.__name__}.{name}")

    def __call__(self, *a, **k):
        raise RuntimeError(f"{self.__name__} was left out of this FlashInfer tree")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if any(name == s or name.startswith(s + ".") for s in SKIPPED):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _Absent(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
