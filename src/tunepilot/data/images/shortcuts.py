"""Shortcuts: a file property that alone predicts the class (a leakage signal, D2/D8).

When every 7 was scanned at 16 x 16 and every other digit at 8 x 8, a model can score on 7s
without looking at a stroke, and will fail on the first 7 from another scanner. The test is a
rule a person can re-check by hand: on the training split, each value of one property (size,
mode, format, aspect ratio, EXIF orientation) predicts its most frequent class; scored on the
evaluation splits, that rule's accuracy is compared with the majority-class rate, and a class
is *identified* when the rule finds at least `size_leak_accuracy` of its evaluation images
with at least that precision. Values never seen in training predict the majority class, so a
property that is unique per image (real photos' exact sizes) identifies nothing.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from tunepilot.campaign.image_settings import ImageSettings
from tunepilot.data.images.facts import ImageFacts
from tunepilot.verdict import Finding, Verdict

MIN_CLASS_SUPPORT = 3  # evaluation images a class needs before a shortcut is judged


def check_shortcuts(good: list[ImageFacts], settings: ImageSettings) -> Finding:
    check = "class identified by a file property"
    train = [f for f in good if f.split == "train"]
    held = [f for f in good if f.split != "train"]
    if not train or not held:
        sentence = (
            "cannot validate: a shortcut is judged on evaluation images from a rule learned "
            "on training images, and one of the two is empty"
        )
        return Finding(check, Verdict.WARN, sentence, "D2")
    labels = Counter(str(f.example.label) for f in train)
    majority = labels.most_common(1)[0][0]
    majority_rate = sum(str(f.example.label) == majority for f in held) / len(held)
    threshold = settings.size_leak_accuracy
    hits, scores = [], {}
    for prop in train[0].properties():
        by_value: dict[str, Counter[str]] = defaultdict(Counter)
        for f in train:
            by_value[f.properties()[prop]][str(f.example.label)] += 1
        rule = {v: c.most_common(1)[0][0] for v, c in by_value.items()}
        predicted = [rule.get(f.properties()[prop], majority) for f in held]
        gold = [str(f.example.label) for f in held]
        scores[prop] = sum(p == g for p, g in zip(predicted, gold, strict=True)) / len(held)
        for label in sorted(set(gold)):
            support = sum(g == label for g in gold)
            chosen = sum(p == label for p in predicted)
            right = sum(p == g == label for p, g in zip(predicted, gold, strict=True))
            if support < MIN_CLASS_SUPPORT or not chosen:
                continue
            recall, precision = right / support, right / chosen
            if recall >= threshold and precision >= threshold and support / len(held) < threshold:
                values = sorted(v for v, c in rule.items() if c == label)
                files = [f for f in held if str(f.example.label) == label][:2]
                hits.append((prop, label, values, recall, precision, files))
    details = {
        "accuracy_from_property": {p: round(s, 4) for p, s in scores.items()},
        "majority_class_rate": round(majority_rate, 4),
        "threshold": threshold,
        "identified": [
            {
                "property": p,
                "class": c,
                "values": v[:10],
                "recall": round(r, 4),
                "precision": round(pr, 4),
            }
            for p, c, v, r, pr, _ in hits
        ],
    }
    best = max(scores, key=lambda p: scores[p])
    if not hits:
        sentence = (
            f"no file property identifies a class (best: label from {best} alone "
            f"{scores[best]:.2f} accurate on evaluation images vs majority-class rate "
            f"{majority_rate:.2f})"
        )
        return Finding(check, Verdict.PASS, sentence, "D2", details=details)
    parts = [
        f"{prop} {'/'.join(values[:3])} identifies class {label} ({recall:.0%} of its evaluation "
        f"images, {precision:.0%} precise; e.g. {', '.join(f.name for f in files)})"
        for prop, label, values, recall, precision, files in hits[:4]
    ]
    sentence = (
        f"{'; '.join(parts)}; label from {best} alone is {scores[best]:.2f} accurate vs "
        f"majority-class rate {majority_rate:.2f}: the model can learn the file, not the "
        "picture; collect or convert every class the same way (same size, mode and "
        "format) or add images of that class from other sources"
    )
    ids = [f.example.id for *_, files in hits[:3] for f in files]
    return Finding(check, Verdict.FAIL, sentence, "D2", ids, details)
