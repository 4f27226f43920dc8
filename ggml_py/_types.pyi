# Type aliases of the public API, for annotations only: modules import them under
# TYPE_CHECKING (there is no runtime module ggml_py._types).
from typing import Any, Callable, Union

import numpy as np
from typing_extensions import Buffer

from ggml_py._backend import Backend
from ggml_py._core import Tensor

# a backend given as object, name or priority index (Scheduler.backend_id)
BackendRef = Union[Backend, str, int]

# ggml_backend_sched_eval_callback: callback(tensor, ask) -> bool
EvalCallback = Callable[[Tensor, bool], bool]

# what set_tensor takes: bytes, bytearray, memoryview, a numpy array (anything with the
# buffer protocol; numpy's stubs declare it only for Python >= 3.12)
BytesLike = Union[Buffer, np.ndarray[Any, Any]]
