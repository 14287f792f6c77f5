"""rmsgauge core, the bottom of the import graph: the :class:`Claim` record, the tolerance helper, the seed
function, the atomic writer and the CLI guard every other package shares (nothing here imports them).
"""

from rmsgauge.atomic import atomic_write_bytes, atomic_write_json, atomic_write_text, json_safe
from rmsgauge.claims import (
    Claim,
    ClaimGroup,
    claims_table,
    run_claims,
    write_claims_json,
)
from rmsgauge.cli import (
    Failure,
    add_subcommand,
    add_subcommands,
    check_choice,
    check_output_dir,
    check_output_file,
    check_outputs_against_inputs,
    check_range,
    make_parser,
    parse_dtype,
    parse_float_list,
    reject_unknown_keys,
    run_main,
)
from rmsgauge.seeding import seed_everything
from rmsgauge.tolerance import Tolerance, assert_close, eps_of, tolerance

__all__ = [
    "Claim",
    "ClaimGroup",
    "Failure",
    "Tolerance",
    "add_subcommand",
    "add_subcommands",
    "assert_close",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "check_choice",
    "check_output_dir",
    "check_output_file",
    "check_outputs_against_inputs",
    "check_range",
    "claims_table",
    "eps_of",
    "json_safe",
    "make_parser",
    "parse_dtype",
    "parse_float_list",
    "reject_unknown_keys",
    "run_claims",
    "run_main",
    "seed_everything",
    "tolerance",
    "write_claims_json",
]
