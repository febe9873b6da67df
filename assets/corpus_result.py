"""A corpus step's outcome (lexgraph.indexing.corpus_update.StepOutcome) as Dagster metadata, data version and
check result: what every corpus asset returns."""
import dagster as dg

from lexgraph.ids import content_hash
from lexgraph.indexing import corpus_update


def _corpus_version(context: dg.AssetExecutionContext, digest: str) -> dg.DataVersion:
    """A corpus asset's data version: its code version and the catalog it was built from, so rebuilding
    from the same catalog with the same code changes nothing downstream."""
    code = context.assets_def.code_versions_by_key.get(context.asset_key) or ""
    return dg.DataVersion(content_hash(f"{context.asset_key.to_user_string()}\n{code}\n{digest}"))


def corpus_result(context: dg.AssetExecutionContext, outcome: corpus_update.StepOutcome, check: str | None = None,
                  **extra) -> dg.MaterializeResult:
    """A corpus step's outcome as Dagster metadata, data version and check result."""
    for line in outcome.warnings:
        context.log.warning(line)
    for line in outcome.errors:
        context.log.error(line)
    metadata = {**outcome.figures, **{k: dg.MetadataValue.json(v) for k, v in outcome.details.items()},
                **{k: dg.MetadataValue.md(v) for k, v in outcome.tables.items()},
                **{k: dg.MetadataValue.path(v) for k, v in outcome.paths.items()}, **extra}
    checks = [dg.AssetCheckResult(check_name=check, passed=outcome.passed, metadata=outcome.check)] if check else []
    return dg.MaterializeResult(metadata=metadata, check_results=checks,
                                data_version=_corpus_version(context, outcome.version_key or outcome.digest))


def run_step(step, *args) -> corpus_update.StepOutcome:
    """A corpus step whose input step was never built fails the asset with the step's own words."""
    try:
        return step(*args)
    except corpus_update.StepNotBuilt as error:
        raise dg.Failure(str(error)) from error
