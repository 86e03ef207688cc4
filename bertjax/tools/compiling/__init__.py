"""The compile tool's parts (`python -m bertjax.tools.compile`): compiling a
config's steps for a TPU slice (`compiler`), reading the compiled programs
(`program`), counting their matrix work (`jaxpr_flops`), the rows a step
really computes (`real_work`) and the report (`report`)."""
