# find_package(tensorplay-rpc CONFIG): the imported targets
#   tensorplay-rpc::tensorplay_rpc_shared  the shared library (link this)
#   tensorplay-rpc::tensorplay_rpc         the static archive
# and tensorplay-rpc::tensorplay-rpc, an alias of the shared one.
include(CMakeFindDependencyMacro)
find_dependency(Threads)
find_dependency(PkgConfig)
# The archive's dependencies, as the build found them.
pkg_check_modules(SQLITE3 REQUIRED IMPORTED_TARGET sqlite3)
pkg_check_modules(LIBUV REQUIRED IMPORTED_TARGET libuv)
pkg_check_modules(LIBCRYPTO REQUIRED IMPORTED_TARGET libcrypto)
include(${CMAKE_CURRENT_LIST_DIR}/tensorplay-rpc-targets.cmake)
if(NOT TARGET tensorplay-rpc::tensorplay-rpc)
  add_library(tensorplay-rpc::tensorplay-rpc INTERFACE IMPORTED)
  set_target_properties(tensorplay-rpc::tensorplay-rpc PROPERTIES
                        INTERFACE_LINK_LIBRARIES tensorplay-rpc::tensorplay_rpc_shared)
endif()
