"""The dev stack: what `levers9 dev` starts on one machine, on the product side of the emulator.

`levers9 dev up` starts the sandbox (the emulator, `sandbox/`), the cloud around it (the
registries, moto), Temporal's dev server and the controlplane, and writes the dev values that
point the pool at the sandbox. It is a user of the emulator, as `levers9 sandbox` is: it may
import `sandbox`, and only `levers9 dev`, `levers9 sandbox` and the demo's timeline
(`levers9.cli.dev`, `.sandbox`, `.demo_timeline`; and the tests) import it. The rest of the
product never imports it (.importlinter, contracts `devstack` and `emulator`).

Modules: `stack` (`DevStack`: up, down, status, the env file; the cloud around the sandbox),
`processes` (one process at a time: start, record, is it still ours, wait for its port, stop)
and `values` (the dev values: the spec's pool block pointing at the sandbox). What stays in the
emulator is the emulator's own: the sandbox's saved cluster (`sandbox.persist`) and the sweep of
what its nodes' agents left (`sandbox.strays`), which the sandbox runs at start and `dev down`
asks for.

Importing this package loads nothing: `levers9 --help` never pays for it.
"""
