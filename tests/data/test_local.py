"""One client's own data: readers' glue, checks naming file/row/column, splits, federated standardisation."""

import json

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_svmlight_file

from fedmcmc.data import local


@pytest.fixture(scope="module")
def frame():
    return load_breast_cancer(as_frame=True).frame.rename(columns={"target": "label"})


def sites(folder, frame):
    """Three CSV files of different sizes and label balance (malignant-heavy, balanced, benign-only)."""
    malignant, benign = frame[frame.label == 0], frame[frame.label == 1]
    parts = {"site_a.csv": malignant.iloc[:150], "site_b.csv": frame.iloc[:80],
             "site_c.csv": benign.iloc[:200]}
    for name, part in parts.items():
        part.to_csv(folder / name, index=False)
    return list(parts)


CSV = {"target": "label", "classes": [0, 1]}


def test_files_one_client_each_with_names_and_classes(tmp_path, frame):
    names = sites(tmp_path, frame)
    clients = local.read_clients({**CSV, "files": names}, tmp_path)
    assert [len(c.y) for c in clients] == [150, 80, 200]
    assert clients[0].feature_names == tuple(frame.columns[:-1]) and clients[0].x.dtype == np.float64
    assert clients[0].y.sum() == 0 and clients[2].y.min() == 1  # label balance as written
    np.testing.assert_array_equal(clients[1].x, frame.iloc[:80, :-1].to_numpy())
    named = local.read_clients({"files": names, "target": -1, "classes": ["1", "0"]}, tmp_path)  # by index
    np.testing.assert_array_equal(named[1].y, 1 - clients[1].y)


@pytest.mark.parametrize("kind, extra", [("iid", {}), ("unbalanced", {"sigma": 0.5}), ("dirichlet", {"alpha": 0.5}),
                                         ("dominant_label", {}), ("beta_binary", {"a": 1.0, "b": 1.0})])
def test_one_file_and_each_partitioner(tmp_path, frame, kind, extra):
    frame.to_csv(tmp_path / "all.csv", index=False)
    section = {**CSV, "file": "all.csv", "seed": 3, "partition": {"kind": kind, "num_clients": 4, **extra}}
    clients = local.read_clients(section, tmp_path)
    assert len(clients) == 4 and all(len(c.y) for c in clients)
    rows = np.concatenate([c.x for c in clients])
    assert len(np.unique(rows, axis=0)) == len(rows) <= len(frame)  # disjoint parts of the file
    again = local.read_clients(section, tmp_path)
    assert all(np.array_equal(a.x, b.x) for a, b in zip(clients, again))


def test_builtin_split_by_a_partition():
    clients = local.read_clients({"builtin": "breast-cancer", "partition": {"kind": "iid", "num_clients": 3}})
    assert [len(c.y) for c in clients] == [190, 190, 189] and clients[0].x.shape[1] == 30


def test_npz_libsvm_leaf_and_idx_round_trips(tmp_path, frame):
    x, y = frame.iloc[:40, :-1].to_numpy(), frame.label.to_numpy()[:40]
    np.savez(tmp_path / "a.npz", x=x, y=y)
    got = local.read_client({}, "a.npz", tmp_path)
    np.testing.assert_array_equal(got.x, x)
    np.testing.assert_array_equal(got.y, y)

    lines = [f"{v} " + " ".join(f"{j + 1}:{float(x[i, j])!r}" for j in range(x.shape[1])) for i, v in enumerate(y)]
    (tmp_path / "a.svm").write_text("\n".join(lines) + "\n")
    got = local.read_client({}, "a.svm", tmp_path)
    np.testing.assert_array_equal(got.x, x)
    np.testing.assert_array_equal(got.y, y)
    assert load_svmlight_file(str(tmp_path / "a.svm"))[0].shape == x.shape

    users = {"u1": {"x": x[:10].tolist(), "y": y[:10].tolist()}, "u2": {"x": x[10:].tolist(), "y": y[10:].tolist()}}
    (tmp_path / "leaf.json").write_text(json.dumps({"users": ["u1", "u2"], "user_data": users}))
    clients = local.read_clients({"file": "leaf.json"}, tmp_path)  # the natural partition by user
    assert [c.source.split("#")[1] for c in clients] == ["u1", "u2"] and [len(c.y) for c in clients] == [10, 30]
    np.testing.assert_allclose(clients[1].x, x[10:], rtol=1e-6)  # LEAF stores float32
    one = local.read_client({}, {"file": "leaf.json", "user": "u2"}, tmp_path)
    np.testing.assert_array_equal(one.x, clients[1].x)
    with pytest.raises(ValueError, match="holds 2 LEAF users; name one"):
        local.read_client({}, "leaf.json", tmp_path)

    images = np.arange(3 * 4 * 4, dtype=np.uint8).reshape(3, 4, 4)
    (tmp_path / "img").write_bytes(bytes([0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0, 4]) + images.tobytes())
    (tmp_path / "lab").write_bytes(bytes([0, 0, 8, 1, 0, 0, 0, 3, 2, 0, 1]))
    got = local.read_client({}, {"images": "img", "labels": "lab"}, tmp_path)
    assert got.x.shape == (3, 4, 4) and got.y.tolist() == [2, 0, 1]
    np.testing.assert_allclose(got.x, images / 255.0, rtol=1e-6)


def test_federated_standardisation_equals_the_pooled_rows(tmp_path, frame):
    clients = local.read_clients({**CSV, "files": sites(tmp_path, frame)}, tmp_path)
    parts = [local.split_client(7, i, c, 0.25) for i, c in enumerate(clients)]
    assert [len(t.y) for _, t in parts] == [38, 20, 50] and [len(t.y) for t, _ in parts] == [112, 60, 150]
    scaling = local.pooled_scale([local.moments(t.x) for t, _ in parts])
    pooled = np.concatenate([t.x for t, _ in parts])
    np.testing.assert_allclose(scaling.mean, pooled.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(scaling.scale, pooled.std(axis=0), rtol=1e-9)
    scaled = np.concatenate([local.apply_scaling(t.x, scaling) for t, _ in parts])
    np.testing.assert_allclose(scaled.mean(axis=0), 0, atol=1e-9)
    np.testing.assert_allclose(scaled.std(axis=0), 1, rtol=1e-9)
    # each node draws its own split alone: the same rows from the seed and its index only
    again = local.split_client(7, 1, clients[1], 0.25)
    np.testing.assert_array_equal(again[1].x, parts[1][1].x)
    constant = local.pooled_scale([local.moments(np.full((5, 1), 0.1))])
    assert constant.scale.tolist() == [1.0]


def test_bad_data_names_file_row_and_column(tmp_path, frame):
    f = frame.iloc[:6].astype(object)
    f.iloc[3, 2] = "n/a"
    f.to_csv(tmp_path / "text.csv", index=False)
    with pytest.raises(ValueError, match=r"text.csv row 4 \(line 5\), column 'mean perimeter': 'n/a' is not a number"):
        local.read_client(CSV, "text.csv", tmp_path)
    with pytest.raises(ValueError, match=r"row 2 \(line 3\), column 'label': label '7' is not among classes"):
        local.read_client({"target": "label", "classes": [0, 1]}, _csv(tmp_path, "a,label\n1,0\n2,7\n"), tmp_path)
    with pytest.raises(ValueError, match=r"row 1 \(line 2\), column 'a': 'inf' is not a finite number"):
        local.read_client(CSV, _csv(tmp_path, "a,label\ninf,0\n"), tmp_path)
    with pytest.raises(ValueError, match=r"label 'yes' is not a class index.*classes = \["):
        local.read_client({"target": "label"}, _csv(tmp_path, "a,label\n1,yes\n"), tmp_path)
    with pytest.raises(ValueError, match=r"holds no data rows"):
        local.read_client(CSV, _csv(tmp_path, "a,label\n"), tmp_path)
    np.savez(tmp_path / "nan.npz", x=np.array([[1.0, np.nan]]), y=np.array([0]))
    with pytest.raises(ValueError, match=r"nan.npz row 0 \(x\[0\]\), column 1: nan is not a finite"):
        local.read_client({}, "nan.npz", tmp_path)


def _csv(folder, text, name="t.csv"):
    (folder / name).write_text(text)
    return name
