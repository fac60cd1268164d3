"""``ftready-forecast recipe.toml [--target "RTX 4090"]``: the memory forecast as a command,
beside the pytest face. Exit status: 0 fits (or no target to judge against), 1 does not fit,
2 cannot tell (a broken recipe, an unknown target, no config, a step that cannot be traced)."""

from __future__ import annotations

import argparse
import sys
from typing import Optional


def main(argv: Optional[list[str]] = None) -> int:
    from .forecast.levers import forecast_report
    from .forecast.trace import ConfigUnavailable, TraceError
    from .machine.targets import TargetError, resolve_target
    from .outcomes import Fail
    from .outputs.forecast_text import render
    from .recipe.schema import RecipeError
    from .recipe import load_recipe

    parser = argparse.ArgumentParser(prog="ftready-forecast",
                                     description="forecast the peak memory of a recipe's training step from the "
                                                 "model's config alone (no weights), against a target device")
    parser.add_argument("recipe", help="recipe.toml")
    parser.add_argument("--target", default=None,
                        help='a size ("24GiB") or a device ("RTX 4090", "H100", "M3 Max 64GB"); '
                             "default: the recipe's [hardware] target")
    parser.add_argument("--no-levers", action="store_true", help="do not forecast the levers when it does not fit")
    args = parser.parse_args(argv)
    try:
        recipe = load_recipe(args.recipe)
        text = args.target or recipe.hardware.target
        where = "--target" if args.target else f"{args.recipe} [hardware] target"
        target = resolve_target(text, where) if text else None
        report = forecast_report(recipe, target, levers=not args.no_levers)
    except (RecipeError, TargetError, ConfigUnavailable, TraceError, Fail) as exc:
        print(f"ftready-forecast: {exc}", file=sys.stderr)
        return 2
    print(render(report))
    fits = report.fits
    if recipe.hardware.device == "mlx":  # the run the team launches is mlx-lm's: its own forecast beside
        from .forecast.mlx import forecast_text

        text, mlx_fits = forecast_text(recipe, target)
        print(text)
        fits = mlx_fits if mlx_fits is not None else fits
    return 1 if fits is False else 0


if __name__ == "__main__":
    raise SystemExit(main())
