"""Conan 2 recipe for etude, a header-only C++20 library.

Build from the repository root with conan/run.sh, or directly:
    conan create conan --profile:all conan/profiles/debian --build=missing
"""
import os

from conan import ConanFile
from conan.tools.build import check_min_cppstd
from conan.tools.files import copy

required_conan_version = ">=2.0"


class EtudeConan(ConanFile):
    name = "etude"
    version = "0.1.0"
    description = "Header-only C++20 library"
    topics = ("header-only", "blas", "openmp")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    no_copy_source = True

    # The recipe lives in conan/; the sources are one level up.
    def export_sources(self):
        root = os.path.join(self.recipe_folder, "..")
        dst = self.export_sources_folder
        copy(self, "CMakeLists.txt", src=root, dst=dst)
        copy(self, "LICENSE*", src=root, dst=dst)
        copy(self, "*.cmake", src=os.path.join(root, "cmake"), dst=os.path.join(dst, "cmake"))
        copy(self, "*.cmake.in", src=os.path.join(root, "cmake"), dst=os.path.join(dst, "cmake"))
        for pattern in ("*.hpp", "*.cuh"):
            copy(self, pattern, src=os.path.join(root, "include"), dst=os.path.join(dst, "include"))

    def requirements(self):
        # CBLAS provider. With conan/profiles/debian this is satisfied by the
        # system package through [platform_requires] and never fetched.
        self.requires("openblas/[>=0.3.20 <0.4]")

    def package_id(self):
        self.info.clear()

    def validate(self):
        if self.settings.get_safe("compiler.cppstd"):
            check_min_cppstd(self, 20)

    def package(self):
        copy(self, "LICENSE*", src=self.source_folder, dst=os.path.join(self.package_folder, "licenses"))
        for pattern in ("*.hpp", "*.cuh"):
            copy(self, pattern, src=os.path.join(self.source_folder, "include"),
                 dst=os.path.join(self.package_folder, "include"))

    def package_info(self):
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.set_property("cmake_file_name", "etude")
        self.cpp_info.set_property("cmake_target_name", "etude::etude")
        self.cpp_info.set_property("pkg_config_name", "etude")

        # An openblas from [platform_requires] is hidden from self.dependencies
        # (and has no package folder): generators get nothing to link, so link
        # the system library. A real openblas package propagates by itself.
        openblas = self.dependencies.get("openblas") if "openblas" in self.dependencies else None
        if openblas is None or openblas.package_folder is None:
            self.cpp_info.system_libs.append("openblas")

        # OpenMP: the headers use OpenMP pragmas, so consumers compile and link
        # with the compiler's OpenMP flag.
        compiler = str(self.settings.compiler)
        if compiler in ("gcc", "clang"):
            self.cpp_info.cxxflags.append("-fopenmp")
            self.cpp_info.sharedlinkflags.append("-fopenmp")
            self.cpp_info.exelinkflags.append("-fopenmp")
        elif compiler == "msvc":
            self.cpp_info.cxxflags.append("/openmp")
        if self.settings.os in ("Linux", "FreeBSD"):
            self.cpp_info.system_libs.extend(["m", "pthread"])

        # Not modelled here, as etude::data is not: the two optional rendering headers need a
        # system library each, which a consumer that includes them links itself (the CMake
        # package's etude::audio and etude::image targets do it): etude/track/synth.hpp needs
        # FluidSynth (pkg-config fluidsynth, Debian's libfluidsynth-dev), etude/track/piano_roll.hpp
        # libpng (Debian's libpng-dev). Likewise etude/dist/mpi.hpp needs MPI (find_package(MPI),
        # Debian's libopenmpi-dev; the CMake package's etude::mpi). Every other header needs none.
