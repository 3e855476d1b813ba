# leappConfig.cmake: find_package(leapp) for leapp's C++ pipeline runner (docs/deploy.md).
#   cmake -Dleapp_DIR="$(leapp --cmake-dir)" ...   then   target_link_libraries(app PRIVATE leapp::pipeline)
# This file sits in <site-packages>/leapp/cmake; the library and header are in the package itself.
get_filename_component(_leapp_package "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
if (NOT EXISTS "${_leapp_package}/libleapp_pipeline.so")
  set(leapp_FOUND FALSE)
  set(leapp_NOT_FOUND_MESSAGE "${_leapp_package}/libleapp_pipeline.so is missing (reinstall leapp with ONNX Runtime's headers)")
  return()
endif()
if (NOT TARGET leapp::pipeline)
  add_library(leapp::pipeline SHARED IMPORTED)
  set_target_properties(leapp::pipeline PROPERTIES
    IMPORTED_LOCATION "${_leapp_package}/libleapp_pipeline.so"
    INTERFACE_INCLUDE_DIRECTORIES "${_leapp_package}/include"
    INTERFACE_COMPILE_FEATURES cxx_std_17)
endif()
set(leapp_FOUND TRUE)
