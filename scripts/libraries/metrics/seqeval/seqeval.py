"""An ``evaluate`` metric named seqeval, over the ``seqeval`` package from PyPI, for libraries that call
``evaluate.load("seqeval")`` (SpanMarker). ``evaluate.load`` looks for ``./seqeval/seqeval.py`` in the working
directory before asking the Hub, so a process started in ``scripts/libraries/metrics`` loads this file offline.

It returns what the Hub's metric of that name returns: per entity type ``{"precision", "recall", "f1", "number"}``,
then ``overall_precision``, ``overall_recall``, ``overall_f1`` (micro averages over entities) and
``overall_accuracy`` (over tags).
"""

import datasets
import evaluate


class Seqeval(evaluate.Metric):
    def _info(self):
        tags = datasets.Sequence(datasets.Value("string", id="label"), id="sequence")
        return evaluate.MetricInfo(description=__doc__, citation="", inputs_description="lists of IOB tags a sentence",
                                   features=datasets.Features({"predictions": tags, "references": tags}))

    def _compute(self, predictions, references, suffix: bool = False, scheme=None, mode=None, sample_weight=None,
                 zero_division="warn"):
        from seqeval.metrics import accuracy_score, classification_report
        from seqeval import scheme as schemes

        if scheme is not None:  # a scheme's name, as the Hub's metric takes it
            scheme = getattr(schemes, scheme)
        report = classification_report(references, predictions, suffix=suffix, output_dict=True, scheme=scheme,
                                       mode=mode, sample_weight=sample_weight, zero_division=zero_division)
        micro = report.pop("micro avg")
        for summary in ("macro avg", "weighted avg"):
            report.pop(summary, None)
        results = {kind: {"precision": float(r["precision"]), "recall": float(r["recall"]), "f1": float(r["f1-score"]),
                          "number": int(r["support"])} for kind, r in report.items()}
        results.update(overall_precision=float(micro["precision"]), overall_recall=float(micro["recall"]),
                       overall_f1=float(micro["f1-score"]),
                       overall_accuracy=float(accuracy_score(references, predictions)))
        return results
