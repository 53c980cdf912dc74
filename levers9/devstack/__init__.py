"""The dev stack: what `levers9 dev` starts on one machine, on the product side of the emulator.

`levers9 dev up` starts the sandbox (the emulator, `sandbox/`), the cloud around it (the
registries, moto), Temporal's dev server and the controlplane, and writes the dev values that
point the pool at the sandbox. It is a user of the emulator, as `levers9 sandbox` is: it may
import `sandbox`, and only `levers9.cli.dev` and `levers9.cli.sandbox` (and the tests) import
it. The rest of the product never imports it (.importlinter, contract `emulator`).

Modules: `values` (the dev values: the spec's pool block pointing at the sandbox).

Importing this package loads nothing: `levers9 --help` never pays for it.
"""
