"""The commands of `convsync`, one module per family; `client.cli` parses and dispatches.

Each `cmd_*` takes the parsed arguments and returns the exit code; a failure a user can cause
raises `CliError` (`common`), which `client.cli.main` prints as one line.
"""
