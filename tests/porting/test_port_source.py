"""port_source: import statements are rewritten to ours keeping the names they bind, marked
lines replaced, and the differing lines counted by kind."""
from __future__ import annotations

import pytest

from port_source import port

pytestmark = pytest.mark.timeout(10)

TORCH_PROGRAM = '''\
import json
import torch, time
import torch.nn.functional as F
import torch.utils.data.distributed
from torch.optim import (SGD,
                         AdamW)
import horovod.torch as hvd


def main():
    from torch.nn.parallel import DistributedDataParallel as DDP  # inside a function
    init_process_group(backend="gloo")  # CPU: not nccl
    use_cuda = torch.cuda.is_available()  # port: use_cuda = False
    return json, time, F, SGD, AdamW, hvd, DDP, use_cuda
'''


def test_imports_are_rewritten_keeping_their_names_and_counted():
    ours, counts = port(TORCH_PROGRAM)
    lines = ours.splitlines()
    assert lines[0] == "import json"
    assert lines[1] == "import neural_arch as torch, time"
    assert lines[2] == "import neural_arch.nn.functional as F"
    assert lines[3] == "import neural_arch as torch, neural_arch.utils.data.distributed"
    assert lines[4] == "from neural_arch.optim import (SGD,"
    assert lines[5] == "                         AdamW)"
    assert lines[6] == "import neural_arch.horovod as hvd"
    assert lines[10] == ("    from neural_arch.nn.parallel import DistributedDataParallel as DDP"
                         "  # inside a function")
    assert lines[11] == '    init_process_group(backend="gloo")  # CPU: not nccl'
    assert lines[12] == "    use_cuda = False"
    assert (counts.imports, counts.cpu, counts.other) == (6, 1, 1)
    assert counts.other_lines == ((13, "use_cuda = torch.cuda.is_available()  "
                                        "# port: use_cuda = False"),)
    compile(ours, "ours", "exec")


def test_a_program_without_torch_is_left_alone():
    source = "import numpy as np\nfrom os import path\nx = np.zeros(3)\n"
    ours, counts = port(source)
    assert ours == source
    assert (counts.imports, counts.cpu, counts.other) == (0, 0, 0)


def test_a_port_mark_on_an_import_line_is_refused():
    with pytest.raises(ValueError, match="line 1: `# port:` on an import line"):
        port("import torch  # port: import numpy\n")
