// Rendering a plan: readable breakdown (each term, its formula in words, its value), JSON, and an SVG chart.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "planner/plan.h"

namespace trident::planner {

std::string render_text(const PlanInput& in, const MeshShape& m, const MeshCheck& chk, const Plan& p);
nlohmann::json plan_json(const PlanInput& in, const MeshShape& m, const MeshCheck& chk, const Plan& p);

std::string render_recipe_text(const Recommendation& r, int64_t world);
nlohmann::json recipe_json(const Recommendation& r);

// `top`: how many ranked meshes to print (each with why it wins or fails).
std::string render_search_text(const PlanInput& in, const SearchResult& s, int top);
nlohmann::json search_json(const PlanInput& in, const SearchResult& s, int top);

// Stacked bar of the per-GPU memory breakdown with labels and the GPU capacity line.
std::string render_svg(const PlanInput& in, const MeshShape& m, const Plan& p);

std::string mesh_str(const MeshShape& m);  // "(d_rep,fsdp,cp)=(4,1,64) x (e_fsdp,ep)=(4,64)"

}  // namespace trident::planner
