"""The public face of the Stage contract, for plugins: `from llmopt_bench.stage import Stage, ...`.

The contract lives in llmopt_bench.core.contract and the records that cross it in
llmopt_bench.core.records; this module only names them where third-party stages import them
(docs/architecture.md, "Write a stage"). Code inside llmopt imports the core modules."""

from llmopt_bench.core.contract import Requirements, Stage, StageContext, StageSkipped
from llmopt_bench.core.records import (
    Block,
    Claim,
    LoadInfo,
    NoParams,
    OpenExtra,
    QualityRecord,
    RequestSample,
    SLOPoint,
    StageFacts,
    StageRun,
    StrictModel,
)

__all__ = ["Block", "Claim", "LoadInfo", "NoParams", "OpenExtra", "QualityRecord", "Requirements", "RequestSample",
           "SLOPoint", "Stage", "StageContext", "StageFacts", "StageRun", "StageSkipped", "StrictModel"]
