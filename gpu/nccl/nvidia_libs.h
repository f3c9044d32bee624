// Finding NVIDIA's shared libraries (NCCL, cuBLAS) at run time, where the system folders may not hold them: images
// that install CUDA's libraries as Python wheels put them in site-packages/nvidia/<package>/lib.
#pragma once
#include <string>
#include <vector>

namespace trident::nccl {

// dlopen (RTLD_NOW | RTLD_LOCAL) of the first of `sonames` found: first by the loader's own search
// (LD_LIBRARY_PATH, the run path, ld.so.cache, the system folders), then in the wheel folders nvidia/<pkg>/lib under
// every site-packages / dist-packages of $VIRTUAL_ENV, $CONDA_PREFIX, $PYTHONPATH, $HOME/.local, /usr/local, /usr
// and /opt/conda (python3.*). Returns the handle, or nullptr with *tried listing what failed.
void* dlopen_nvidia(const std::vector<std::string>& sonames, const std::string& pkg, std::string* tried);

// The wheel folders searched for pkg (those that exist), in the order dlopen_nvidia tries them.
std::vector<std::string> nvidia_wheel_dirs(const std::string& pkg);

// The file a dlopen handle was loaded from (the loader's link map), or "" when unknown.
std::string library_path(void* handle);

}  // namespace trident::nccl
