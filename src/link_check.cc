// The translation unit of the dependency check's shared objects (src/CMakeLists.txt): each
// holds one library whole and nothing of its own.
