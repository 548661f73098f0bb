"""Tables for tabular models: reading columns (NumPy, pandas, CSV), a preprocessor fitted on
the training rows, datasets of encoded rows, scikit-learn's bundled tables, and a generated
table of any size."""
from .bundled import BUNDLED_TABLES, load_bundled
from .dataset import TabularDataset, split_datasets
from .preprocessor import EncodedRows, TabularPreprocessor
from .synthetic import SyntheticTable
from .table import MISSING_MARKERS, Table, as_table, column_is_missing, read_csv, take_rows

__all__ = ["TabularDataset", "TabularPreprocessor", "EncodedRows", "split_datasets",
           "load_bundled", "BUNDLED_TABLES", "as_table", "read_csv", "take_rows",
           "column_is_missing", "MISSING_MARKERS", "Table", "SyntheticTable"]
