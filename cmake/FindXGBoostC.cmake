# Finds the XGBoost C API (Debian: libxgboost-dev) and defines the target XGBoost::C.
# Debian 12's xgboost-config.cmake also imports the `xgboost` command-line tool, which lives in
# a separate package, and fails when that tool is absent; the C API needs only the header and
# the shared library, so we look for those directly.
find_path(XGBOOST_INCLUDE_DIR xgboost/c_api.h)
find_library(XGBOOST_LIBRARY NAMES xgboost)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(XGBoostC REQUIRED_VARS XGBOOST_LIBRARY XGBOOST_INCLUDE_DIR)
if(XGBoostC_FOUND AND NOT TARGET XGBoost::C)
  add_library(XGBoost::C UNKNOWN IMPORTED)
  set_target_properties(XGBoost::C PROPERTIES
    IMPORTED_LOCATION "${XGBOOST_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${XGBOOST_INCLUDE_DIR}")
endif()
