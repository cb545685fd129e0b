"""scripts/check_layering.py against small trees with known includes: it must
pass a clean tree and name every upward or sibling include of a bad one."""
import importlib.util
import os
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "check_layering.py")
spec = importlib.util.spec_from_file_location("check_layering", SCRIPT)
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


def tree(files):
    """A temporary ROOT holding {relative path: text}."""
    root = tempfile.TemporaryDirectory()
    for rel, text in files.items():
        path = os.path.join(root.name, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return root


CLEAN = {
    "include/coremesh/core/tensor.hpp": "#include <vector>\n",
    "include/coremesh/runtime/stream.hpp": '#include "coremesh/core/tensor.hpp"\n',
    "include/coremesh/ops/gemm.hpp": '#include "coremesh/runtime/stream.hpp"\n',
    "include/shmem.h": "#include <stddef.h>\n",
    "src/runtime/internal.hpp": '#include "coremesh/runtime/stream.hpp"\n',
    "src/runtime/stream.cpp": '#include "internal.hpp"\n#include "coremesh/core/tensor.hpp"\n',
    "src/ops/detail/launch.hpp": '#include "coremesh/runtime/stream.hpp"\n',
    "src/ops/gemm.cpp": '#include "detail/launch.hpp"\n#include <cblas.h>\n',
    "src/shmem/c_rma.cpp": '#include "shmem.h"\n',
    "src/parallel/comm.cpp": '#include "coremesh/ops/gemm.hpp"\n#include "shmem.h"\n',
    "src/model/model.cpp": '#include "coremesh/ops/gemm.hpp"\n#include "coremesh/parallel/comm.hpp"\n',
    "src/cli/main.cpp": '#include "coremesh/model/model.hpp"\n',
}


class CheckLayering(unittest.TestCase):
    def run_on(self, extra):
        with tree({**CLEAN, **extra}) as root:
            return check.violations(root), check.main(["check_layering.py", root])

    def test_clean_tree_passes(self):
        found, rc = self.run_on({})
        self.assertEqual(found, [])
        self.assertEqual(rc, 0)

    def test_upward_include_in_a_source_fails(self):
        found, rc = self.run_on({"src/runtime/bad.cpp": '#include "coremesh/ops/gemm.hpp"\n'})
        self.assertEqual(rc, 1)
        self.assertEqual(len(found), 1)
        self.assertIn("src/runtime/bad.cpp:1: runtime includes coremesh/ops/gemm.hpp", found[0])
        self.assertIn("higher layer", found[0])

    def test_model_and_train_reach_shmem_only_through_parallel(self):
        found, rc = self.run_on({"src/train/trainer.cpp": '#include "coremesh/shmem/rma.hpp"\n',
                                 "include/coremesh/model/bad.hpp": '#include "shmem.h"\n'})
        self.assertEqual(rc, 1)
        self.assertEqual(len(found), 2)
        self.assertTrue(all("reached through parallel" in f for f in found), found)

    def test_upward_include_in_a_public_header_fails(self):
        found, rc = self.run_on({"include/coremesh/core/bad.hpp": "#include <coremesh/model/model.hpp>\n"})
        self.assertEqual(rc, 1)
        self.assertIn("core includes coremesh/model/model.hpp", found[0])

    def test_sibling_include_fails(self):
        found, rc = self.run_on({"src/ops/bad.cpp": '// ok\n#include "coremesh/graph/graph.hpp"\n',
                                 "src/graph/bad.cpp": '#include "shmem.h"\n'})
        self.assertEqual(rc, 1)
        self.assertEqual(sorted(f.split(":")[0] + ":" + f.split(":")[1] for f in found),
                         ["src/graph/bad.cpp:1", "src/ops/bad.cpp:2"])
        self.assertTrue(all("sibling" in f for f in found))

    def test_relative_upward_include_fails(self):
        found, rc = self.run_on({"src/core/bad.cpp": '#include "../runtime/internal.hpp"\n'})
        self.assertEqual(rc, 1)
        self.assertIn("core includes ../runtime/internal.hpp (runtime is a higher layer)", found[0])

    def test_system_and_unknown_headers_are_ignored(self):
        found, rc = self.run_on({"src/core/ok.cpp": '#include <fmt/format.h>\n#include "coremesh/version.hpp"\n'})
        self.assertEqual((found, rc), ([], 0))


if __name__ == "__main__":
    unittest.main()
