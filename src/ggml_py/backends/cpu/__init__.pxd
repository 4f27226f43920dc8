# a package for Cython: its modules are named ggml_py.backends.cpu.*
