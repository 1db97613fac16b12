# `cmake --install build/release --prefix P`: the CLI and the controller in P/bin, the C API
# (libkareus_c.so, and the MPI plugin `--mpi` loads from <bin>/../lib) in P/lib, the public
# headers in P/include/kareus, and the data the CLI reads at run time (the paper's workloads for
# `optimize --suite paper`, the measurements `calibrate` refits) in P/share/kareus, where the CLI
# looks relative to itself (tools/kareus/shipped_path.cc). The wheel (pyproject.toml) moves all
# of these into the package folder with the same layout.
include(GNUInstallDirs)
install(TARGETS kareus kareus-freqd RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS kareus_c LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
if(TARGET kareus_mpi)
  install(TARGETS kareus_mpi LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
install(DIRECTORY include/kareus DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(DIRECTORY workloads data DESTINATION ${CMAKE_INSTALL_DATADIR}/kareus)
