# The notebook kernels' settings, installed into the virtual environment by `make install`
# (.venv/etc/ipython/, where IPython looks for its environment's configuration).
c = get_config()  # noqa: F821 (IPython's config loader defines it)

# ipykernel warns at every start that its local TCP sockets are not encrypted: nineteen times
# in `make test` (one kernel per notebook). The kernels listen on the loopback interface of the
# machine that runs the build; only errors of the kernel application itself are printed.
c.IPKernelApp.log_level = "ERROR"
